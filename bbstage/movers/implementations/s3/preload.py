"""Imported by the executor's forkserver before it forks any worker: parses botocore's S3
model and endpoint rules once (``common.warm``), so no worker pays for it at its first
S3 transfer."""

from bbstage.movers.implementations.s3.common import warm

warm()
