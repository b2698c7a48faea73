"""The channel of a runner in a sandbox (call_runner.py, judge_runner.py, repl_runner.py).

Standalone (stdlib only): its source (RUNNER_CHANNEL) is prepended to each runner's source. stdin holds one line,
the number of the channel's file descriptor (a socket to the launcher), then ends; messages on the channel are
lines. os.read and os.write are bound here, before any code the runner serves can replace them.
"""

import os as _os

_channel_read, _channel_write = _os.read, _os.write


def _channel_fd():
    """The channel's file descriptor, read from stdin's one line; None when stdin ends before it."""
    line = b""
    while not line.endswith(b"\n"):
        chunk = _channel_read(0, 64)
        if not chunk:
            return None
        line += chunk
    return int(line)


def _line_channel(fd, dumps):
    """(receive, send) on `fd`: receive() gives the next line's bytes without its newline (None at the end);
    send(message) writes dumps(message) and a newline."""
    buffer = b""

    def receive():
        nonlocal buffer
        while b"\n" not in buffer:
            chunk = _channel_read(fd, 65536)
            if not chunk:
                return None
            buffer += chunk
        line, _, buffer = buffer.partition(b"\n")
        return line

    def send(message):
        data = (dumps(message) + "\n").encode()
        while data:
            data = data[_channel_write(fd, data) :]

    return receive, send
