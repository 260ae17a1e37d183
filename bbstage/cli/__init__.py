"""The `bbstage` command and its talk to the daemon."""
