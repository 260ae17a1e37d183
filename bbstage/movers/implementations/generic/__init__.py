"""The generic mover: any pair of backends that has no fast path of its own
(``Backend.movers``), through fsspec (``mover.GenericMover``).

It reads the source through its backend's filesystem (a local source through
``localfs.open_source``: no symbolic link followed) and streams it, ``chunk_size`` bytes at
a time, to the destination, through the worker: store to store never touches a disk. The
stores it reaches are backends of their own, one module each beside this package
(``gcs``, ``azure``, ``https``, ``sftp``, on ``fsstore.StoreBackend``; ``s3`` and ``posix``
too). The rules of every transfer hold:

* local destinations: a temporary file beside the destination, renamed into place when its
  size is right (``localfs.atomic_file``), mode ``0o644`` (directories ``0o755``) and the
  source's modification time;
  a big file from a store (without ``checksum=``) is read in ranges, several at once, each
  written in place in that temporary file (the backend's ``ranges``: their size and number,
  measured per store against rclone, docs/performance.md);
* stores that make an object appear whole when its upload completes (GCS, Azure Blob) are
  written in place: the upload is the atomic step; stores that do not (SFTP) get a
  temporary name beside the destination, renamed when complete;
* ``checksum=``: the digest of the bytes read is compared with a digest of what was
  written, read back (a mismatch is retried);
* ``overwrite=``, resume (a file already current is not copied again: same size, and a
  destination at least as new as the source), cancel (between chunks), progress per chunk.

A transfer's two sides are ``side.Side`` (a backend and its filesystems); a store's errors
are translated in one table (``errors._ERRORS``, as s3fs's ``errors.py``).
"""
