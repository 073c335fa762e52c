"""Edge images and the offline bundle: built without a registry or a Docker engine.

``python -m edge_images`` builds, from Debian's packages and a local wheelhouse:

- a root filesystem (``mmdebstrap``; :mod:`edge_images.rootfs`),
- a wheelhouse of exactly what the agent's virtual environment has installed
  (:mod:`edge_images.wheelhouse`),
- OCI images with ``buildah`` (``--storage-driver vfs``, ``--isolation chroot``):
  the CPU agent, the CUDA agent and the coordinator (:mod:`edge_images.images`),
  exported as OCI and Docker archives,
- the offline bundle for boxes without containers (:mod:`edge_images.bundle`).

Everything heavy is cached under ``~/.cache/edgefleet/images`` keyed by its inputs
(:mod:`edge_images.cache`), so a second build with the same inputs reuses it.
"""
