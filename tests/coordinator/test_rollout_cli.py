"""The operator CLI's rollout table (``python -m coordinator rollouts list``)."""

from __future__ import annotations

import argparse

import pytest

from coordinator.cli.rollouts import _print


def _row(rollout_id: str, model: str, version: str, previous: str | None) -> dict[str, object]:
    return {"rollout_id": rollout_id, "model": model, "version": version,
            "previous_version": previous, "state": "completed", "step": 1, "steps": 2,
            "moved": 2, "agents": 2, "detail": "every step passed"}  # fmt: skip


def test_the_list_columns_fit_long_model_versions(capsys: pytest.CaptureFixture[str]) -> None:
    rows = [
        _row("ro-dbcf518f3559", "smollm2-135m-instruct", "fp32", "int4-b9715715a4c2"),
        _row("ro-000000000001", "tiny-llama", "fp32-260c2ca25d9d", None),
    ]
    _print(argparse.Namespace(json=False), {"object": "list", "data": rows})
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["ROLLOUT", "TARGET", "FROM", "STATE", "STEP", "MOVED", "DETAIL"]
    # every cell stays apart from its neighbours, and each column starts where its head does
    assert lines[1].split()[:6] == ["ro-dbcf518f3559", "smollm2-135m-instruct@fp32",
                                    "int4-b9715715a4c2", "completed", "2/2", "2/2"]  # fmt: skip
    assert lines[2].split()[:3] == ["ro-000000000001", "tiny-llama@fp32-260c2ca25d9d", "-"]
    for head in ("TARGET", "FROM", "STATE", "STEP", "MOVED", "DETAIL"):
        column = lines[0].index(head)
        assert lines[1][column - 2 : column] == "  " and lines[1][column] != " "
        assert lines[2][column - 2 : column] == "  " and lines[2][column] != " "
