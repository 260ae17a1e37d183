"""The ciphers the generic stores' encrypted connections ask for first: AES-GCM with a
128-bit key where the CPU has AES instructions (``cpu_has_aes``), as rclone's Go client
does; elsewhere the library's own order (ChaCha20 first in asyncssh; OpenSSL's AES-256
first, which the CPU then does in software either way). Only the order changes: every
cipher the library offers is still offered, and the server still decides.

Both ends of a copy pay for the cipher, and on a transfer node the server is often a
neighbour on the same CPUs: AES-128 takes 10 rounds a block where AES-256 takes 14."""

from __future__ import annotations

import functools

# SFTP (asyncssh's "^" puts these first, before its own order): 1 GiB up to the local sshd
# 1.9-2.1 s against 3.0-3.9 s with chacha20-poly1305 (1.5 s of the client's CPU against
# 2.5-3.0 s; rclone 3.4 s), and the server decrypts faster too
SSH_AES_FIRST = "^aes128-gcm@openssh.com,aes256-gcm@openssh.com"

# HTTPS (libcurl over OpenSSL), TLS 1.3: the three suites OpenSSL offers by default, AES-128
# first (its own order puts AES-256 first). TLS 1.2: OpenSSL's DEFAULT list, its AES-256
# then ChaCha20 suites moved after the AES-128-GCM ones, then the CBC suites (SHA-2 and SHA-1
# MACs) and those without forward secrecy (kRSA) after every AEAD one; nothing added or
# removed. 1 GiB from the local nginx (TLS 1.2), 10 rounds each, twice, in one process beside
# rclone: medians 1.099 s and 1.078 s against 1.156 s and 1.133 s (docs/performance.md)
TLS13_AES_FIRST = "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256"
TLS12_AES_FIRST = "DEFAULT:+AES256:+CHACHA20:+SHA256:+SHA384:+SHA1:+kRSA"


@functools.cache
def cpu_has_aes(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Does this CPU have AES instructions (x86's ``aes`` flag, Arm's ``aes`` feature)?"""
    try:
        with open(cpuinfo, encoding="ascii", errors="replace") as f:
            return any(
                line.split(":", 1)[0].strip() in ("flags", "Features")
                and "aes" in line.split(":", 1)[1].split()
                for line in f
            )
    except OSError:
        return False
