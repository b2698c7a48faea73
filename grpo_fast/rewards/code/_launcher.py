"""Sandbox launcher: runs as root at the start of the sandbox, sets it up, runs the candidate unprivileged.

Standalone (stdlib only), started by `sandbox.py` as `python -I -S _launcher.py`, inside
`unshare --mount --net --pid --fork --kill-child` when the machine allows it. Reads one JSON job on
stdin, writes one JSON result on stdout.

Job: {"isolate": bool, "root": dir for the new root (empty, root-owned), "workdir": working directory
without isolate, "binds": [host paths shown read-only], "uid": int or null (stay the current user),
"limits": {...}, "files": {name: text},
"runs": [{"argv": [...], "stdin": str | null, "probes": [probe, ...] | null}]}.
Result: {"runs": [{"exit": int | null, "timed_out": bool, "stdout": str, "stderr": str,
"output_exceeded": bool, "loaded": bool, "probes": [{"answer": {...}} | {"error": str}]}]}

With `isolate`: the launcher (PID 1 of a fresh PID namespace, in its own mount and network namespaces)
builds a read-only root from a small tmpfs holding read-only binds of `binds`, a minimal /dev (binds
of null, zero, full, random and urandom; fd/stdin/stdout/stderr links; a private tmpfs /dev/shm), a
fresh /proc, and a size-limited tmpfs at /sandbox (the only other writable place, /tmp points to it),
then chroots into it. Every run is a child that drops to `uid` (no supplementary groups,
no_new_privs), applies the resource limits, and execs with a scrubbed environment. After each run,
kill(-1) empties the PID namespace: a setsid() or double fork inside does not escape it. Without
`isolate`: same limits and timeouts in a temporary working directory, as `uid` when given (root
without namespaces; afterwards every process of that uid is killed), else as the current user
(afterwards the run's process group is killed, then every process that escaped it: the launcher is a
child subreaper, so orphans of the run are re-parented to it and found by their parent pid).

Probe protocol (Python assert tests, see probe_runner.py): the runner's channel is one end of a
socketpair, placed at a random fd number that the launcher writes on the runner's stdin (obscurity
only). The runner loads the program and says {"loaded": true}; then, for each probe, the launcher
checks that nothing arrived since the last answer, adds a fresh random token to the probe, sends it,
and accepts as answer the next line only if it carries that token, within `wall_s` per probe.
So every accepted answer was written after that probe was issued and is the only one for it; early,
extra, duplicated, tokenless or mistokened lines fail the probe, and the runner is replaced for the
next probes. A runner that dies or times out is also replaced; one that never loads fails every probe.
The token does not stop the program from answering in the runner's place (it shares the runner's
interpreter and can read the token); what it bounds is what an answer can be (see plan.py).
"""

import ctypes
import fcntl
import json
import os
import resource
import select
import signal
import sys
import time

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PR_SET_NO_NEW_PRIVS, PR_SET_CHILD_SUBREAPER = 38, 36
AF_UNIX, SOCK_STREAM, SOCK_CLOEXEC = 1, 1, 0o2000000
DEVICES = ("null", "zero", "full", "random", "urandom")
DEV_LINKS = {
    "fd": "/proc/self/fd",
    "stdin": "/proc/self/fd/0",
    "stdout": "/proc/self/fd/1",
    "stderr": "/proc/self/fd/2",
}
NOFILE = 256
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
    _build_dev(root + "/dev", limits)
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


def _build_dev(dev, limits):
    """/dev with what Python needs and nothing else of the host (no GPUs, disks, ttys, host /dev/shm):
    each device node bound alone, read-only (writing a device node reaches the device, not the file
    system, so /dev/null still takes output; the read-only directory keeps the nodes from being
    replaced), links to the process's own fds, and a private size-limited /dev/shm."""
    os.makedirs(dev)
    for name in DEVICES:
        with open(f"{dev}/{name}", "w"):
            pass  # the mount point
        _mount(f"/dev/{name}", f"{dev}/{name}", None, MS_BIND)
        _mount(None, f"{dev}/{name}", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NOEXEC)
    for name, target in DEV_LINKS.items():
        os.symlink(target, f"{dev}/{name}")
    os.makedirs(dev + "/shm")
    options = f"size={limits['disk_bytes']},mode=1777"
    _mount("tmpfs", dev + "/shm", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, options)


def _child(job, argv, fds, workdir):
    """In the forked child: wire `fds` ({number in the child: fd here}), limits, drop privileges, exec.
    Never returns."""
    try:
        # Move every source above the targets first, so that no dup2 overwrites a source not yet moved.
        moved = {target: fcntl.fcntl(fd, fcntl.F_DUPFD, NOFILE) for target, fd in fds.items()}
        for target, fd in moved.items():
            os.dup2(fd, target)
        keep = sorted(fds)
        for low, high in zip(keep, keep[1:] + [1 << 16], strict=True):
            os.closerange(low + 1, high)
        os.setsid()
        limits = job["limits"]
        for name, value in (
            ("RLIMIT_CPU", limits["cpu_s"]),
            ("RLIMIT_AS", limits["memory_bytes"]),
            ("RLIMIT_FSIZE", limits["file_bytes"]),
            ("RLIMIT_NPROC", limits["nproc"]),
            ("RLIMIT_CORE", 0),
            ("RLIMIT_NOFILE", NOFILE),
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
    """One run's child with its pipes (stdin, stdout, stderr) and, for probe runs, its channel: our end
    of a socketpair whose other end the child has at a random fd number, sent on its stdin."""

    def __init__(self, job, argv, stdin_text, workdir, channel=False):
        (stdin_r, stdin_w), (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe(), os.pipe()
        child_fds = {0: stdin_r, 1: out_w, 2: err_w}
        self.channel = None
        if channel:
            number = 10 + int.from_bytes(os.urandom(4), "big") % (NOFILE - 16)
            self.channel, child_fds[number] = _socketpair()
            stdin_text = f"{number}\n"
        self.pid = os.fork()
        if self.pid == 0:
            _child(job, argv, child_fds, workdir)
        for fd in child_fds.values():
            os.close(fd)
        self.stdout, self.stderr = out_r, err_r
        readers = [out_r, err_r] + ([self.channel] if channel else [])
        self.out = {fd: bytearray() for fd in readers}
        self.open = set(readers)
        self.outgoing = {stdin_w: (stdin_text or "").encode()}
        if channel:
            self.outgoing[self.channel] = b""
        for fd in self.outgoing:
            os.set_blocking(fd, False)
        self.exceeded = False
        self.limit = job["limits"]["output_bytes"]
        self._flush(stdin_w)

    def _flush(self, fd):
        """Write what is pending on `fd` (dropped if the child closed its end); close stdin once done."""
        try:
            written = os.write(fd, self.outgoing[fd][:65536]) if self.outgoing[fd] else 0
            self.outgoing[fd] = self.outgoing[fd][written:]
        except (BrokenPipeError, ConnectionResetError):
            self.outgoing[fd] = b""
        if fd != self.channel and not self.outgoing[fd]:
            del self.outgoing[fd]
            os.close(fd)

    def _round(self, timeout):
        """One select: write what is pending, read what has arrived."""
        writers = [fd for fd, data in self.outgoing.items() if data]
        readable, writable, _ = select.select(list(self.open), writers, [], max(timeout, 0))
        for fd in writable:
            if fd in self.outgoing:
                self._flush(fd)
        for fd in readable:
            try:
                data = os.read(fd, 65536)
            except ConnectionResetError:
                data = b""
            if not data:
                self.open.discard(fd)
            self.out[fd] += data
            if sum(len(b) for b in self.out.values()) > self.limit:
                self.exceeded = True

    def _take_line(self):
        buffer = self.out[self.channel]
        if b"\n" not in buffer:
            return None
        line, _, rest = bytes(buffer).partition(b"\n")
        self.out[self.channel] = bytearray(rest)
        return line

    def pump(self, deadline, until_line=False):
        """Move bytes until the child's output ends (or, with until_line, a full line is on the channel),
        the output limit is hit, or the deadline passes. Returns the line (until_line) or None."""
        while self.open:
            line = self._take_line() if until_line else None
            if line is not None:
                return line
            left = deadline - time.monotonic()
            if left <= 0 or self.exceeded:
                return None
            self._round(left)
        return self._take_line() if until_line else None

    def quiet(self):
        """Whether nothing arrived on the channel beyond the lines taken (checks what is in flight)."""
        if self.open:
            self._round(0)
        return not self.out[self.channel]

    def send(self, message):
        """Queue one JSON line on the channel, written while pumping."""
        self.outgoing[self.channel] += (json.dumps(message) + "\n").encode()

    def finish(self, job):
        """Kill everything the run left behind and reap the child; returns its exit code."""
        if job["isolate"]:
            os.kill(-1, signal.SIGKILL)
        elif job["uid"] is not None:
            _kill_uid(job["uid"])
        else:
            _kill_group(self.pid)
        for fd in set(self.out) | set(self.outgoing):
            os.close(fd)
        _, status = os.waitpid(self.pid, 0)
        if job["isolate"]:
            _reap_all()
        else:
            _kill_descendants()
        return os.waitstatus_to_exitcode(status)


def _socketpair():
    """A connected pair of Unix stream sockets, as fds (libc: the socket module costs ~5 ms to import)."""
    fds = (ctypes.c_int * 2)()
    if _libc.socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"socketpair: {os.strerror(err)}")
    return fds[0], fds[1]


def _kill_group(pgid):
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


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


def _kill_descendants(patience_s=2.0):
    """Without namespaces: kill and reap the processes a run left behind outside its process group
    (setsid, double fork). The launcher is a child subreaper, so they are re-parented to it when their
    parents die; each pass kills the current children, whose own children come up for the next pass.
    A program that keeps forking faster than this for `patience_s` leaves the rest running."""
    end = time.monotonic() + patience_s
    while time.monotonic() < end:
        while True:  # reap what already exited
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                return
        for pid in _children():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.001)


def _children():
    """PIDs whose parent is this process (from /proc)."""
    me, children = os.getpid(), []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    fields = f.read().rpartition(b")")[2].split()
            except OSError:
                continue
            if int(fields[1]) == me:
                children.append(int(entry))
    return children


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
    """The probe protocol (module doc): one answer per probe, in order, restarting the runner when it
    dies, times out or says anything but the answer to the probe just sent."""
    wall, probes = job["limits"]["wall_s"], run["probes"]
    answers, loaded = [], False
    while len(answers) < len(probes):
        proc = _Process(job, run["argv"], None, workdir, channel=True)
        if _decode(proc.pump(time.monotonic() + wall, until_line=True)).get("loaded") is not True:
            proc.finish(job)
            break
        loaded = True
        while len(answers) < len(probes):
            answer, trusted = _ask(proc, probes[len(answers)], wall)
            answers.append(answer)
            if not trusted:
                break
        proc.finish(job)
    answers += [{"error": "program did not load"}] * (len(probes) - len(answers))
    return {"loaded": loaded, "probes": answers}


def _ask(proc, probe, wall):
    """Send one probe with a fresh token and read its answer: ({"answer": ...} or {"error": ...}, whether
    the runner may go on)."""
    if not proc.quiet():
        return {"error": "the runner wrote before the probe was sent"}, False
    token = os.urandom(16).hex()
    proc.send({**probe, "token": token})
    message = _decode(proc.pump(time.monotonic() + wall, until_line=True))
    if not message:
        return {"error": "no answer (timeout, crash, exit or malformed line)"}, False
    # A plain comparison: timing reveals nothing the program cannot read in its own interpreter anyway.
    if message.pop("token", None) != token:
        return {"error": "answer without this probe's token"}, False
    return {"answer": message}, True


def _decode(line):
    """The JSON object on `line`, or {} (no line, not JSON, not an object)."""
    try:
        message = json.loads(line) if line is not None else {}
    except ValueError:
        return {}
    return message if isinstance(message, dict) else {}


def main():
    job = json.loads(sys.stdin.read())
    sys.stdin.close()
    if not job["isolate"]:
        _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
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
