"""Sandbox launcher: runs as root at the start of the sandbox, sets it up, runs the candidate unprivileged.

Standalone (stdlib only), started by `sandbox.py` as `python -I -S _launcher.py`, inside
`unshare --mount --net --pid --fork --kill-child` when the machine allows it. Reads one JSON job on
stdin, writes one JSON result on stdout.

Job: {"isolate": bool, "root": dir for the new root (empty, root-owned), "workdir": working directory
without isolate, "binds": [host paths shown read-only], "uid": int or null (stay the current user),
"limits": {...}, "files": {name: text},
"runs": [{"argv": [...], "stdin": str | null, "probes": [probe, ...] | null}]}.
Result: {"runs": [{"exit": int | null, "timed_out": bool, "stdout": str, "stderr": str,
"output_exceeded": bool, "loaded": bool, "probes": [{"ok": bool, "value": str | null, "error": str}]}]}

With `isolate`: the launcher (PID 1 of a fresh PID namespace, in its own mount and network namespaces)
builds a read-only root from a small tmpfs holding read-only binds of `binds` and /dev, a fresh /proc,
and a size-limited tmpfs at /sandbox (the only writable place, /tmp points to it), then chroots into
it. Every run is a child that drops to `uid` (no supplementary groups, no_new_privs), applies the
resource limits, and execs with a scrubbed environment. After each run, kill(-1) empties the PID
namespace. Without `isolate`: same limits and timeouts in a temporary working directory, as `uid`
when given (root without namespaces; afterwards every process of that uid is killed), else as the
current user (afterwards the run's process group is killed).

Probe protocol (Python assert tests, see probe_runner.py): the runner loads the program, writes
{"loaded": true} on fd 3, then for each probe the launcher writes one JSON line on fd 4 and waits for
one JSON line back on fd 3, within `wall_s` per probe. A runner that dies is restarted for the next
probe; one that never loads fails every probe.
"""

import ctypes
import json
import os
import resource
import select
import signal
import sys
import time

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PR_SET_NO_NEW_PRIVS = 38
ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/sandbox",
    "TMPDIR": "/sandbox",
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONHASHSEED": "0",
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}
_libc = ctypes.CDLL(None, use_errno=True)


def _mount(source, target, fstype, flags, data=None):
    enc = [None if x is None else x.encode() for x in (source, target, fstype, data)]
    if _libc.mount(enc[0], enc[1], enc[2], ctypes.c_ulong(flags), enc[3]) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {source} -> {target}: {os.strerror(err)}")


def _bind_ro(host, target, extra=MS_NOSUID):
    _mount(host, target, None, MS_BIND)
    _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | extra)


def build_root(job):
    """Mount the read-only root described in the module docstring and chroot into it."""
    root, limits = job["root"], job["limits"]
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
    for host in job["binds"]:
        target = root + host
        if os.path.islink(host):
            os.makedirs(os.path.dirname(target), exist_ok=True)
            os.symlink(os.readlink(host), target)
        elif os.path.isdir(host):
            os.makedirs(target, exist_ok=True)
            _bind_ro(host, target, MS_NOSUID | MS_NODEV)
    os.makedirs(root + "/dev")
    _bind_ro("/dev", root + "/dev")
    os.makedirs(root + "/proc")
    _mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.makedirs(root + "/sandbox")
    _mount("tmpfs", root + "/sandbox", "tmpfs", MS_NOSUID | MS_NODEV, f"size={limits['disk_bytes']},mode=700")
    os.chown(root + "/sandbox", job["uid"], job["uid"])
    if not os.path.lexists(root + "/tmp"):
        # /tmp -> /sandbox; when a bound host path lives under /tmp (a checkout or venv there), /tmp is
        # already a read-only directory of the root and TMPDIR alone points programs at /sandbox.
        os.symlink("/sandbox", root + "/tmp")
    _mount(None, root, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.chroot(root)
    os.chdir("/sandbox")
    return "/sandbox"


def _child(job, argv, fds, workdir):
    """In the forked child: wire fds 0-4, limits, drop privileges, exec. Never returns."""
    try:
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        os.closerange(len(fds), 1 << 16)
        os.setsid()
        limits = job["limits"]
        for name, value in (
            ("RLIMIT_CPU", limits["cpu_s"]),
            ("RLIMIT_AS", limits["memory_bytes"]),
            ("RLIMIT_FSIZE", limits["file_bytes"]),
            ("RLIMIT_NPROC", limits["nproc"]),
            ("RLIMIT_CORE", 0),
            ("RLIMIT_NOFILE", 256),
        ):
            resource.setrlimit(getattr(resource, name), (value, value))
        if job["uid"] is not None:
            os.setgroups([])
            os.setgid(job["uid"])
            os.setuid(job["uid"])
        _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        os.chdir(workdir)
        env = dict(ENV, HOME=workdir, TMPDIR=workdir)
        os.execve(argv[0], argv, env)
    finally:
        os._exit(127)


class _Process:
    """One run's child with its pipes: stdin, stdout, stderr, results (fd 3), probes (fd 4)."""

    def __init__(self, job, argv, stdin_text, workdir):
        pipes = [os.pipe() for _ in range(5)]
        child_ends = [pipes[0][0], pipes[1][1], pipes[2][1], pipes[3][1], pipes[4][0]]
        self.pid = os.fork()
        if self.pid == 0:
            _child(job, argv, child_ends, workdir)
        for fd in child_ends:
            os.close(fd)
        self.stdout, self.stderr, self.results = pipes[1][0], pipes[2][0], pipes[3][0]
        self.probes = pipes[4][1]
        self.out = {self.stdout: bytearray(), self.stderr: bytearray(), self.results: bytearray()}
        self.open = set(self.out)
        self.exceeded = False
        self.limit = job["limits"]["output_bytes"]
        stdin_w = pipes[0][1]
        self.pending_stdin = (stdin_text or "").encode()
        self.stdin = stdin_w
        os.set_blocking(stdin_w, False)
        if not self.pending_stdin:
            os.close(stdin_w)
            self.stdin = None

    def pump(self, deadline, until_line=False):
        """Move bytes until the child's output ends (or, with until_line, a full line is on fd 3), the
        output limit is hit, or the deadline passes. Returns the line (until_line) or None."""
        while self.open:
            if until_line and b"\n" in self.out[self.results]:
                line, _, rest = bytes(self.out[self.results]).partition(b"\n")
                self.out[self.results] = bytearray(rest)
                return line
            left = deadline - time.monotonic()
            if left <= 0 or self.exceeded:
                return None
            writers = [self.stdin] if self.stdin is not None else []
            readable, writable, _ = select.select(list(self.open), writers, [], left)
            if writable:
                try:
                    n = os.write(self.stdin, self.pending_stdin[:65536])
                    self.pending_stdin = self.pending_stdin[n:]
                except BrokenPipeError:
                    self.pending_stdin = b""
                if not self.pending_stdin:
                    os.close(self.stdin)
                    self.stdin = None
            for fd in readable:
                data = os.read(fd, 65536)
                if not data:
                    self.open.discard(fd)
                self.out[fd] += data
                if sum(len(b) for b in self.out.values()) > self.limit:
                    self.exceeded = True
        if until_line and b"\n" in self.out[self.results]:
            line, _, rest = bytes(self.out[self.results]).partition(b"\n")
            self.out[self.results] = bytearray(rest)
            return line
        return None

    def send(self, message):
        try:
            os.write(self.probes, (json.dumps(message) + "\n").encode())
            return True
        except OSError:
            return False

    def finish(self, job):
        """Kill everything the run left behind and reap the child; returns its exit code."""
        if job["isolate"]:
            os.kill(-1, signal.SIGKILL)
        elif job["uid"] is not None:
            _kill_uid(job["uid"])
        else:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for fd in list(self.out) + [self.probes] + ([self.stdin] if self.stdin is not None else []):
            os.close(fd)
        _, status = os.waitpid(self.pid, 0)
        if job["isolate"]:
            _reap_all()
        return os.waitstatus_to_exitcode(status)


def _kill_uid(uid):
    """SIGKILL every process of `uid`: kill(-1) from a helper running as that uid (it spares itself)."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            os.kill(-1, signal.SIGKILL)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def _reap_all():
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.001)


def _text(data, limit=20000):
    return bytes(data[:limit]).decode("utf-8", "replace")


def _run_plain(job, run, workdir):
    proc = _Process(job, run["argv"], run.get("stdin"), workdir)
    proc.pump(time.monotonic() + job["limits"]["wall_s"])
    timed_out = bool(proc.open) and not proc.exceeded
    code = proc.finish(job)
    return {
        "exit": None if timed_out else code,
        "timed_out": timed_out,
        "output_exceeded": proc.exceeded,
        "stdout": _text(proc.out[proc.stdout], job["limits"]["output_bytes"]),
        "stderr": _text(proc.out[proc.stderr][-4000:]),
    }


def _run_probes(job, run, workdir):
    wall, probes = job["limits"]["wall_s"], run["probes"]
    answers, loaded = [], False
    while len(answers) < len(probes):
        proc = _Process(job, run["argv"], None, workdir)
        line = proc.pump(time.monotonic() + wall, until_line=True)
        if line is None or not _decode(line).get("loaded"):
            proc.finish(job)
            break
        loaded = True
        while len(answers) < len(probes):
            if not proc.send(probes[len(answers)]):
                break
            line = proc.pump(time.monotonic() + wall, until_line=True)
            if line is None:
                answers.append({"ok": False, "value": None, "error": "no answer (timeout, crash or exit)"})
                break
            answers.append(_decode(line))
        proc.finish(job)
    answers += [{"ok": False, "value": None, "error": "program did not load"}] * (len(probes) - len(answers))
    return {"loaded": loaded, "probes": answers}


def _decode(line):
    try:
        message = json.loads(line)
    except ValueError:
        return {"ok": False, "value": None, "error": "malformed answer"}
    return message if isinstance(message, dict) else {"ok": False, "value": None, "error": "malformed answer"}


def main():
    job = json.loads(sys.stdin.read())
    sys.stdin.close()
    workdir = build_root(job) if job["isolate"] else job["workdir"]
    if not job["isolate"] and job["uid"] is not None:
        os.chown(workdir, job["uid"], job["uid"])
    for name, text in job["files"].items():
        path = os.path.join(workdir, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        if job["uid"] is not None:
            os.chown(path, job["uid"], job["uid"])
    results = [(_run_probes if run.get("probes") is not None else _run_plain)(job, run, workdir) for run in job["runs"]]
    sys.stdout.write(json.dumps({"runs": results}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
