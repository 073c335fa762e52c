"""Model sync on the agent: the model store, blob fetching from site peers and the
coordinator, manifest trust, the on-box self-check, hot swap, and per-version stats.

Modules: ``store`` (the signed set on disk), ``fetch`` (Range-resumed, verified
downloads), ``trust`` (pinned and configured signing keys), ``self_check`` (the accuracy
gate on the box), ``manager`` (ModelSync: applies ModelsSection, hot-swaps, inventory),
``blob_server`` (the store served to site peers), ``stats`` (ModelStats per interval),
``setup`` (building it all from the agent's config).
"""
