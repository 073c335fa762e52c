"""An embedding asked for ``wait_for_company=False`` (the semantic cache's lookup, on a
request's critical path) does not wait the batcher's queue delay, and takes what is
pending along; any other input still waits for company."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from agent.engine.embed_batcher import DynamicEmbeddingBatcher, EmbeddingBatchConfig, Vectors

DELAY_S = 0.4


def _vectors(batch: list[list[int]]) -> Vectors:
    return np.asarray([[float(ids[0])] * 4 for ids in batch], dtype=np.float32)


async def test_a_hurried_input_runs_at_once_and_takes_the_pending_along() -> None:
    config = EmbeddingBatchConfig(max_batch_size=32, max_queue_delay_us=int(DELAY_S * 1e6))
    with ThreadPoolExecutor(1) as pool:
        batcher = DynamicEmbeddingBatcher(_vectors, pool, config)
        await batcher.start()
        try:
            started = time.monotonic()
            alone = await batcher.embed([[7]], wait_for_company=False)
            hurried_s = time.monotonic() - started
            assert alone[0][0] == 7.0
            assert hurried_s < DELAY_S / 2, f"a hurried lone input waited {hurried_s:.3f} s"

            started = time.monotonic()
            await batcher.embed([[8]])
            assert time.monotonic() - started >= DELAY_S * 0.9  # the default still waits

            patient = asyncio.ensure_future(batcher.embed([[1], [2]]))
            await asyncio.sleep(0.01)
            started = time.monotonic()
            hurried = await batcher.embed([[3]], wait_for_company=False)
            both = await patient
            assert time.monotonic() - started < DELAY_S / 2
            assert hurried[0][0] == 3.0 and [v[0] for v in both] == [1.0, 2.0]
            assert batcher.batch_sizes[-1] == 3  # one call took all three
        finally:
            await batcher.close()
