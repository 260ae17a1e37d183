"""What runs as root in the daemon: the hooks' state machine, its store, the executors,
the sockets."""
