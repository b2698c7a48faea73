"""Sandbox launcher: sets a sandbox up, then runs programs in it on request, one at a time.

Standalone (stdlib only), started by `session.py` as `python -I -S -c <this source> <caller pid>`: as
root for the "namespaces" backend, inside bubblewrap for "bwrap" (caller pid 0: bwrap ties it to the
caller), as root or the caller's user for the unsandboxed levels. It dies with its caller
(parent-death signal, checked against the caller's pid).

Protocol: one JSON line per message. The first stdin line is the job:
{"isolate": bool, "userns": bool, "root": mount point of the new root (an empty directory), "workdir":
working directory without isolate, "binds": [host paths shown read-only], "uid": int or null (stay the
current user), "limits": {...}, "seccomp": [[code, jt, jf, k], ...] or null, "files": {name: text},
"cgroup": [file descriptors of cgroup.procs files, opened by the caller: every program process joins
those control groups before it execs; the launcher stays out of them]}.
The launcher answers {"ready": true} once the sandbox is set up (nothing of the caller's has run yet), or
{"setup_error": "..."}. Then each request line gets one answer line (a request that fails is answered
{"error": ...}):

Every request that runs something may give "cpu_s", the CPU seconds its processes may use together (default: its
timeout).

- {"op": "run", "argv": [...], "stdin": str, "timeout": s}: run to the end or the timeout ->
  {"exit": int | null, "timed_out": bool, "cpu_exceeded": bool, "stdout": str, "stderr": str,
  "output_exceeded": bool}.
- {"op": "start", "argv": [...], "timeout": s}: start a server (call_runner.py, judge_runner.py)
  with a channel (a socketpair end at a random fd, its number on the server's stdin); answers
  {"started": true} once it says {"hello": true}, else {"error": ..., "exit": ..., "stderr": ...}.
- {"op": "ask", "line": str, "timeout": s}: send one line to the server, answer {"reply": its next
  line}; {"error": ...} (and the server is killed) when it wrote anything before the line was sent,
  does not answer within the timeout ("no answer: timeout"), dies, answers more than `output_bytes`,
  or the sandbox's processes use more CPU time than the timeout ("no answer: CPU time").
- {"op": "stop"}: kill the server -> {"stopped": true}.
- {"op": "write", "files": {name: text}}: write files into the working directory -> {"written": true}
  (a sandbox set up ahead, with its server started, gets its program this way).
At the end of its stdin the launcher kills everything it started and exits.

With `isolate`: the launcher enters new mount, network, PID, IPC and UTS namespaces (it is PID 1 of
the new PID namespace, which no signal of the sandbox's processes reaches; its parent only waits),
builds a read-only root from a small tmpfs holding read-only binds of `binds`, a minimal read-only
/dev (binds of null, zero, full, random and urandom; fd links; a private size-limited tmpfs
/dev/shm), a fresh /proc and a size-limited tmpfs at /sandbox (the only other writable place, /tmp
points to it), and chroots into it. As root ("namespaces") it
starts every process as `uid` (no supplementary groups); in a user namespace ("bwrap", `userns`)
with the capabilities bubblewrap leaves it there, it drops every capability from each process
instead (same uid as the launcher, which is not dumpable: no process of the sandbox may trace it or
open its /proc files). Every process gets no_new_privs, the seccomp filter and the resource limits,
and execs with a scrubbed environment. A request's processes together may use as many CPU seconds
as the request's own time limit (checked every CPU_CHECK_S). After each request nothing of the
sandbox runs until the next: everything but the server is killed, the server is stopped (SIGSTOP;
SIGCONT with the next request) and /dev/shm is emptied; after a run, kill(-1) empties the PID
namespace. Without `isolate`: the same limits in `workdir`, as `uid`
when given (afterwards every process of that uid is killed), else as the current user (afterwards the
process group, then every process that escaped it: the launcher is a child subreaper, so orphans are
re-parented to it and found by their parent pid).
"""

import ctypes
import fcntl
import json
import os
import resource
import select
import signal
import struct
import sys
import time

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWPID, CLONE_NEWNET = (
    0x20000,
    0x4000000,
    0x8000000,
    0x20000000,
    0x40000000,
)
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS, PR_SET_CHILD_SUBREAPER, PR_SET_SECCOMP = 1, 38, 36, 22
PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 4, 24, 47, 4
SECCOMP_MODE_FILTER = 2
MNT_DETACH = 2
STATVFS_FLAGS = {1: MS_RDONLY, 2: MS_NOSUID, 4: MS_NODEV, 8: MS_NOEXEC, 1024: 1024, 2048: 2048, 4096: 1 << 21}
"""statvfs's ST_* flags of a mount -> the MS_* flags a remount of a bind of it must keep (in a user namespace
the kernel refuses a remount that clears the flags of a mount it inherited: noexec, nosuid, atime)."""
CPU_CHECK_S = 0.05
AF_UNIX, SOCK_STREAM, SOCK_CLOEXEC = 1, 1, 0o2000000
DEVICES = ("null", "zero", "full", "random", "urandom")
SHM = "/dev/shm"
DEV_LINKS = {
    "fd": "/proc/self/fd",
    "stdin": "/proc/self/fd/0",
    "stdout": "/proc/self/fd/1",
    "stderr": "/proc/self/fd/2",
}
NOFILE = 256
TAIL = 4096
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


def _check(result, what):
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source, target, fstype, flags, data=None):
    enc = [None if x is None else x.encode() for x in (source, target, fstype, data)]
    _check(_libc.mount(enc[0], enc[1], enc[2], ctypes.c_ulong(flags), enc[3]), f"mount {source} -> {target}")


def _bind_ro(host, target, extra=MS_NOSUID):
    """Bind `host` on `target`, read-only, with `extra` flags and those of the host's mount it must keep."""
    _mount(host, target, None, MS_BIND)
    kept = os.statvfs(host).f_flag
    flags = sum(ms for st, ms in STATVFS_FLAGS.items() if kept & st)
    _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | extra | flags)


def _tmpfs(target, size, mode, flags=MS_NOSUID | MS_NODEV):
    """A tmpfs of `size` bytes and one inode per 4 KiB of it (at least 1024): an inode costs kernel memory that
    the size does not count."""
    _mount("tmpfs", target, "tmpfs", flags, f"size={size},nr_inodes={max(1024, size // 4096)},mode={mode}")


def _die_with(parent):
    """SIGKILL this process when its parent dies (and now, if it already has)."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


def enter_namespaces():
    """unshare mount, network, PID, IPC and UTS namespaces and fork: the child, PID 1 of the new PID
    namespace, returns (and dies with this process); this process waits for it and exits alike."""
    _check(_libc.unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS), "unshare")
    alive_r, alive_w = os.pipe()  # EOF on alive_r: this process is gone (the child cannot see its pid)
    pid = os.fork()
    if pid == 0:
        os.close(alive_w)
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if select.select([alive_r], [], [], 0)[0]:
            os._exit(1)
        os.close(alive_r)
        _libc.sethostname(b"sandbox", 7)
        return
    os.close(alive_r)
    _, status = os.waitpid(pid, 0)
    os._exit(os.waitstatus_to_exitcode(status) & 0xFF)


def build_root(job):
    """Mount the read-only root described in the module docstring and chroot into it."""
    root, limits = job["root"], job["limits"]
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _tmpfs(root, 1 << 20, "755")
    for host in job["binds"]:
        target = root + host
        if os.path.islink(host):
            os.makedirs(os.path.dirname(target), exist_ok=True)
            if not os.path.lexists(target):
                os.symlink(os.readlink(host), target)
        elif os.path.isdir(host):
            os.makedirs(target, exist_ok=True)
            _bind_ro(host, target, MS_NOSUID | MS_NODEV)
        elif os.path.isfile(host):
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "w"):
                pass  # the mount point
            _bind_ro(host, target, MS_NOSUID | MS_NODEV)
    _build_dev(root + "/dev", limits)
    os.makedirs(root + "/proc")
    _mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.makedirs(root + "/sandbox")
    _tmpfs(root + "/sandbox", limits["disk_bytes"], "700")
    if job["uid"] is not None:
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
        _bind_ro(f"/dev/{name}", f"{dev}/{name}", MS_NOSUID | MS_NOEXEC)
    for name, target in DEV_LINKS.items():
        os.symlink(target, f"{dev}/{name}")
    os.makedirs(dev + "/shm")
    _tmpfs(dev + "/shm", limits["disk_bytes"], "1777", MS_NOSUID | MS_NODEV | MS_NOEXEC)


def clear_shm():
    """Empty /dev/shm: a fresh tmpfs in its place (a file still mapped stays with the process that maps it)."""
    if os.listdir(SHM):
        info = os.statvfs(SHM)
        _check(_libc.umount2(SHM.encode(), MNT_DETACH), f"umount {SHM}")
        _tmpfs(SHM, info.f_blocks * info.f_frsize, "1777", MS_NOSUID | MS_NODEV | MS_NOEXEC)


def _install_seccomp(instructions):
    """Load a classic BPF seccomp filter ([[code, jt, jf, k], ...]; no_new_privs must be set)."""
    program = b"".join(struct.pack("HBBI", *ins) for ins in instructions)
    buffer = ctypes.create_string_buffer(program)
    fprog = struct.pack("HxxxxxxP", len(instructions), ctypes.addressof(buffer))
    _check(_libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.c_char_p(fprog), 0, 0), "seccomp")


def _child(job, argv, fds, workdir, cgroups):
    """In the forked child: join the control groups (`cgroups`: fds of their cgroup.procs files), wire `fds`
    ({number in the child: fd here}), limits, drop privileges, exec. Never returns."""
    try:
        for procs in cgroups:
            os.write(procs, b"0")  # this process, and all it starts, counts in the sandbox's group
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
            ("RLIMIT_MSGQUEUE", 0),  # POSIX message queues outlive their processes: none
        ):
            resource.setrlimit(getattr(resource, name), (value, value))
        if job["uid"] is not None:
            os.setgroups([])
            os.setgid(job["uid"])
            os.setuid(job["uid"])
        elif job.get("userns"):
            _drop_capabilities()
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # after setuid, which clears it
        _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        if job.get("seccomp"):
            _install_seccomp(job["seccomp"])
        os.chdir(workdir)
        env = dict(ENV, HOME=workdir, TMPDIR=workdir)
        os.execve(argv[0], argv, env)
    except BaseException as exc:  # noqa: BLE001 - said on the child's stderr: the cause of a failed start
        os.write(2, f"sandbox: cannot start {argv[0]}: {type(exc).__name__}: {exc}\n".encode(errors="replace"))
    finally:
        os._exit(127)


def _drop_capabilities():
    """In a user namespace the launcher holds capabilities there (and the program's uid): the program gets none,
    now (ambient) or by any exec (bounding set; no_new_privs follows)."""
    _check(_libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clear ambient capabilities")
    for capability in range(64):
        if _libc.prctl(PR_CAPBSET_DROP, capability, 0, 0, 0) != 0 and ctypes.get_errno() != 22:  # EINVAL: none
            _check(-1, f"drop capability {capability}")


def sandbox_cpu_s():
    """CPU seconds the processes of this PID namespace have used: each process's own time and that of the
    children it reaped (the launcher's own time left out: only its reaped children's)."""
    ticks = 0
    for pid, fields in _proc_stats():
        utime, stime, cutime, cstime = (int(v) for v in fields[11:15])
        ticks += cutime + cstime + (utime + stime if pid != 1 else 0)
    return ticks / os.sysconf("SC_CLK_TCK")


def _proc_stats():
    """(pid, fields of /proc/<pid>/stat after the command name) for each process still there to read; fields[1]
    is the parent's PID, fields[11:15] utime, stime, cutime, cstime in clock ticks."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    stat = f.read()
            except OSError:  # the process ended since listdir
                continue
            yield int(entry), stat.rpartition(b")")[2].split()


def _namespace_processes(keep):
    """{pid: (state, parent pid)} of this PID namespace's processes but the launcher (PID 1) and `keep`."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) not in (1, keep):
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    fields = f.read().rpartition(b")")[2].split()
            except OSError:
                continue
            found[int(entry)] = (fields[0].decode(), int(fields[1]))
    return found


def empty_namespace(keep, patience_s=2.0):
    """Kill every process of this PID namespace but the launcher and `keep` (the stopped server) and reap those
    left to the launcher; whether it emptied within `patience_s` (the process count limit bounds the passes)."""
    end = time.monotonic() + patience_s
    while time.monotonic() < end:
        found = _namespace_processes(keep)
        if all(state == "Z" and parent != 1 for state, parent in found.values()):
            return True  # only zombies of the stopped server's, which it reaps itself
        for pid, (state, parent) in found.items():
            if state == "Z" and parent == 1:
                os.waitpid(pid, os.WNOHANG)
            elif state != "Z":
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        time.sleep(0.001)
    return False


class _Process:
    """One child with its pipes (stdin, stdout, stderr) and, for servers, its channel: our end of a
    socketpair whose other end the child has at a random fd number, sent on its stdin. A run keeps
    its output up to `output_bytes` in all; a server keeps the last TAIL bytes of stdout and stderr
    and at most `output_bytes` unread on its channel."""

    def __init__(self, job, argv, stdin_text, workdir, cgroups, server=False):
        (stdin_r, stdin_w), (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe(), os.pipe()
        child_fds = {0: stdin_r, 1: out_w, 2: err_w}
        self.channel = None
        if server:
            number = 10 + int.from_bytes(os.urandom(4), "big") % (NOFILE - 16)
            self.channel, child_fds[number] = _socketpair()
            stdin_text = f"{number}\n"
        self.pid = os.fork()
        if self.pid == 0:
            _child(job, argv, child_fds, workdir, cgroups)
        for fd in child_fds.values():
            os.close(fd)
        self.stdout, self.stderr, self.server = out_r, err_r, server
        readers = [out_r, err_r] + ([self.channel] if server else [])
        self.out = {fd: bytearray() for fd in readers}
        self.open = set(readers)
        self.outgoing = {stdin_w: (stdin_text or "").encode()}
        if server:
            self.outgoing[self.channel] = b""
        for fd in self.outgoing:
            os.set_blocking(fd, False)
        self.exceeded = self.over_cpu = False
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
            if self.server and fd != self.channel:
                del self.out[fd][:-TAIL]
            kept = len(self.out[self.channel]) if self.server else sum(len(b) for b in self.out.values())
            if kept > self.limit:
                self.exceeded = True

    def _take_line(self):
        buffer = self.out[self.channel]
        if b"\n" not in buffer:
            return None
        line, _, rest = bytes(buffer).partition(b"\n")
        self.out[self.channel] = bytearray(rest)
        return line

    def pump(self, deadline, until_line=False, over_cpu=None):
        """Move bytes until the child's output ends (or, with until_line, a full line is on the channel),
        the output limit is hit, the deadline passes or `over_cpu()` says the CPU budget is spent (checked every
        CPU_CHECK_S). Returns the line (until_line) or None."""
        while self.open:
            line = self._take_line() if until_line else None
            if line is not None:
                return line
            left = deadline - time.monotonic()
            if left <= 0 or self.exceeded:
                return None
            if over_cpu is not None and over_cpu():
                self.over_cpu = True
                return None
            self._round(left if over_cpu is None else min(left, CPU_CHECK_S))
        return self._take_line() if until_line else None

    def quiet(self):
        """Whether nothing arrived on the channel beyond the lines taken (checks what is in flight)."""
        if self.open:
            self._round(0)
        return not self.out[self.channel]

    def send(self, line):
        """Queue one line on the channel, written while pumping."""
        self.outgoing[self.channel] += line.encode() + b"\n"

    def finish(self, job):
        """Kill everything the child left behind and reap it; returns its exit code."""
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
    _check(_libc.socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), "socketpair")
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
    me = os.getpid()
    return [pid for pid, fields in _proc_stats() if int(fields[1]) == me]


def _text(data, limit=20000):
    return bytes(data[:limit]).decode("utf-8", "replace")


def _stderr(proc):
    return _text(proc.out[proc.stderr][-TAIL:])


class Launcher:
    """The set-up sandbox and its one server (if started). `contained`: the launcher is PID 1 of the sandbox's own
    namespaces (isolate), so it can bound a request's CPU time and empty the sandbox between requests."""

    def __init__(self, job, workdir, cgroups):
        self.job, self.workdir, self.cgroups, self.server = job, workdir, cgroups, None
        self.contained = job["isolate"]

    def handle(self, request):
        try:
            return self._dispatch(request)
        except Exception as exc:  # noqa: BLE001 - a request that fails is answered, the launcher lives on
            return {"error": f"the launcher failed: {type(exc).__name__}: {exc}"[:500]}

    def _dispatch(self, request):
        op = request.get("op")
        timeout = float(request.get("timeout") or self.job["limits"]["wall_s"])
        cpu_s = float(request.get("cpu_s") or timeout)
        if op == "run":
            return self.run(request["argv"], request.get("stdin"), timeout, cpu_s)
        if op == "start":
            return self.start(request["argv"], timeout, cpu_s)
        if op == "ask":
            return self.ask(request["line"], timeout, cpu_s)
        if op == "stop":
            self.stop()
            return {"stopped": True}
        if op == "write":
            _write_files(self.job, self.workdir, request["files"])
            return {"written": True}
        return {"error": f"unknown request {op!r}"}

    def _cpu_budget(self, seconds):
        """A check that the sandbox's processes have used more than `seconds` of CPU time from now (None where
        the launcher does not see them all)."""
        if not self.contained:
            return None
        start = sandbox_cpu_s()
        return lambda: sandbox_cpu_s() - start > seconds

    def run(self, argv, stdin, timeout, cpu_s):
        self.stop()
        proc = _Process(self.job, argv, stdin, self.workdir, self.cgroups)
        proc.pump(time.monotonic() + timeout, over_cpu=self._cpu_budget(cpu_s))
        timed_out = bool(proc.open) and not proc.exceeded
        code = proc.finish(self.job)
        self._clear()
        return {
            "exit": None if timed_out else code,
            "timed_out": timed_out,
            "cpu_exceeded": proc.over_cpu,
            "output_exceeded": proc.exceeded,
            "stdout": _text(proc.out[proc.stdout], self.job["limits"]["output_bytes"]),
            "stderr": _text(proc.out[proc.stderr][-4000:]),
        }

    def start(self, argv, timeout, cpu_s):
        self.stop()
        self.server = _Process(self.job, argv, None, self.workdir, self.cgroups, server=True)
        line = self.server.pump(time.monotonic() + timeout, until_line=True, over_cpu=self._cpu_budget(cpu_s))
        if _decode(line).get("hello") is not True:
            return self.fail("the server did not start (timeout, crash or exit)")
        if not self._pause():
            return self.fail("the sandbox could not be stopped after the server started")
        return {"started": True}

    def ask(self, line, timeout, cpu_s):
        if self.server is None:
            return {"error": "no server"}
        if not self.server.quiet():
            return self.fail("the server wrote before it was asked")
        self._resume()
        self.server.send(line)
        reply = self.server.pump(time.monotonic() + timeout, until_line=True, over_cpu=self._cpu_budget(cpu_s))
        if reply is None:
            if self.server.exceeded:
                return self.fail("answer too large")
            if self.server.over_cpu:
                return self.fail("no answer: CPU time")
            return self.fail("no answer: timeout" if self.server.open else "no answer: the runner exited")
        if not self._pause():
            return self.fail("the sandbox could not be stopped after the answer")
        return {"reply": reply.decode("utf-8", "replace")}

    def _pause(self):
        """Until the next request nothing of the sandbox runs (contained only): the server stopped, every other
        process killed, /dev/shm emptied. Whether that held."""
        if not self.contained:
            return True
        os.kill(self.server.pid, signal.SIGSTOP)
        if not _stopped(self.server.pid) or not empty_namespace(keep=self.server.pid):
            return False
        self._clear()
        return True

    def _resume(self):
        if self.contained:
            os.kill(self.server.pid, signal.SIGCONT)

    def _clear(self):
        if self.contained:
            clear_shm()

    def fail(self, why):
        stderr = _stderr(self.server)
        code = self.stop()
        return {"error": why, "exit": code, "stderr": stderr}

    def stop(self):
        if self.server is None:
            return None
        server, self.server = self.server, None
        code = server.finish(self.job)
        self._clear()
        return code


def _stopped(pid, patience_s=2.0):
    """Wait until every thread of `pid` is stopped (or gone): a process stopped in the middle of a fork has
    finished it. Whether that happened within `patience_s`."""
    end = time.monotonic() + patience_s
    while time.monotonic() < end:
        states = []
        try:
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/stat", "rb") as f:
                    states.append(f.read().rpartition(b")")[2].split()[0])
        except OSError:
            return True  # gone
        if all(state in (b"T", b"t", b"Z", b"X") for state in states):
            return True
        time.sleep(0.0005)
    return False


def _decode(line):
    """The JSON object on `line`, or {} (no line, not JSON, not an object)."""
    try:
        message = json.loads(line) if line is not None else {}
    except (ValueError, RecursionError):
        return {}
    return message if isinstance(message, dict) else {}


def _setup(job):
    """Namespaces and root (isolate), working directory and files; returns the working directory."""
    if job["isolate"]:
        enter_namespaces()
        workdir = build_root(job)
    else:
        _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        workdir = job["workdir"]
        if job["uid"] is not None:
            os.chown(workdir, job["uid"], job["uid"])
    _write_files(job, workdir, job["files"])
    return workdir


def _write_files(job, workdir, files):
    """Write {name: text} into the working directory, owned by the sandbox's uid (a lone surrogate is written as
    the bytes it stands for: invalid UTF-8, which the program's interpreter then refuses)."""
    for name, text in files.items():
        path = os.path.join(workdir, name)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        with open(fd, "w", encoding="utf-8", errors="surrogatepass") as f:
            f.write(text)
        if job["uid"] is not None:
            os.chown(path, job["uid"], job["uid"])


def main():
    if int(sys.argv[1]):
        _die_with(int(sys.argv[1]))
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # no process of the sandbox may trace it or open its /proc files
    requests, out = sys.stdin.buffer, sys.stdout

    def answer(message):
        out.write(json.dumps(message) + "\n")
        out.flush()

    job = json.loads(requests.readline())
    try:
        launcher = Launcher(job, _setup(job), list(job.get("cgroup") or ()))
    except Exception as exc:  # noqa: BLE001 - any set-up failure is reported, not raised
        answer({"setup_error": f"{type(exc).__name__}: {exc}"})
        return
    answer({"ready": True})
    for line in requests:
        answer(launcher.handle(json.loads(line)))
    launcher.stop()


if __name__ == "__main__":
    main()
