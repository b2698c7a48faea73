"""A seccomp filter for sandboxed programs: the system calls no test program needs, refused.

`denylist_filter()` returns a classic BPF program ([[code, jt, jf, k], ...], as struct sock_filter)
for this machine's architecture (x86_64 or aarch64; None elsewhere), which the launcher installs in
each program's process (no_new_privs set) just before exec. It refuses with EPERM:
- tracing and reading other processes: ptrace, process_vm_readv/writev, kcmp;
- the kernel's larger attack surfaces: bpf, perf_event_open, userfaultfd, io_uring_*, keyctl,
  add_key, request_key, fanotify_init, lookup_dcookie, open_by_handle_at, name_to_handle_at;
- mounts and namespaces: mount, umount2, pivot_root, chroot, the new mount API, unshare, setns, and
  clone with any CLONE_NEW* flag (a new user namespace would hand the program capabilities there);
  clone3 answers ENOSYS, so that the C library falls back to clone, whose flags the filter can read;
- prlimit64 on another process (pid != 0): under bwrap the launcher has the program's uid, which may
  otherwise lower the launcher's own limits;
- the machine: reboot, kexec, modules, swap, acct, quotactl, syslog, clocks, vhangup;
- System V IPC (shared memory, message queues, semaphores): its objects outlive their processes and
  a detached segment counts in no process's address space (POSIX shared memory lives in /dev/shm, a
  size-limited tmpfs emptied after every request);
Other architectures' system calls (32-bit x86 through int 0x80, x32) kill the process: their numbers
differ, so a deny list could not hold there.
"""

from __future__ import annotations

import platform

_DENIED = (
    "ptrace process_vm_readv process_vm_writev kcmp bpf perf_event_open userfaultfd io_uring_setup io_uring_enter "
    "io_uring_register keyctl add_key request_key fanotify_init lookup_dcookie open_by_handle_at name_to_handle_at "
    "mount umount2 pivot_root chroot open_tree move_mount fsopen fsconfig fsmount fspick mount_setattr unshare setns "
    "reboot kexec_load kexec_file_load init_module finit_module delete_module swapon swapoff acct quotactl syslog "
    "settimeofday clock_settime adjtimex clock_adjtime vhangup "
    "shmget shmat shmctl shmdt msgget msgsnd msgrcv msgctl semget semop semtimedop semctl"
).split()
_X86_64 = dict(
    zip(
        _DENIED + ["clone", "clone3", "prlimit64"],
        [101, 310, 311, 312, 321, 298, 323, 425, 426, 427, 250, 248, 249, 300, 212, 304, 303, 165, 166, 155, 161, 428]
        + [429, 430, 431, 432, 433, 442, 272, 308, 169, 246, 320, 175, 313, 176, 167, 168, 163, 179, 103, 164, 227]
        + [159, 305, 153]
        + [29, 30, 31, 67, 68, 69, 70, 71, 64, 65, 220, 66]
        + [56, 435, 302],
        strict=True,
    )
)
_AARCH64 = dict(
    zip(
        _DENIED + ["clone", "clone3", "prlimit64"],
        [117, 270, 271, 272, 280, 241, 282, 425, 426, 427, 219, 217, 218, 262, 18, 265, 264, 40, 39, 41, 51, 428]
        + [429, 430, 431, 432, 433, 442, 97, 268, 142, 104, 294, 105, 273, 106, 224, 225, 89, 60, 116, 170, 112]
        + [171, 266, 58]
        + [194, 196, 195, 197, 186, 189, 188, 187, 190, 193, 192, 191]
        + [220, 435, 261],
        strict=True,
    )
)
_ARCHES = {"x86_64": (0xC000003E, _X86_64), "aarch64": (0xC00000B7, _AARCH64)}

_LD_ABS_W, _JEQ_K, _JGE_K, _JSET_K, _RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
_RET_ALLOW, _RET_KILL_PROCESS, _RET_ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
_EPERM, _ENOSYS = 1, 38
_CLONE_NEW = 0x20000 | 0x80 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
_X32_BIT = 0x40000000
_NR, _ARCH, _ARG0 = 0, 4, 16  # offsets in struct seccomp_data (args[0]'s low 32 bits on little endian)


def denylist_filter(machine: str | None = None) -> list[list[int]] | None:
    """The filter for `machine` (default: this one), or None for an architecture it does not know."""
    arch, numbers = _ARCHES.get(machine or platform.machine(), (None, None))
    if arch is None:
        return None
    denied = [numbers[name] for name in _DENIED]
    errno_perm, errno_nosys = _RET_ERRNO | _EPERM, _RET_ERRNO | _ENOSYS
    program = [[_LD_ABS_W, 0, 0, _ARCH], [_JEQ_K, 1, 0, arch], [_RET_K, 0, 0, _RET_KILL_PROCESS]]
    program += [[_LD_ABS_W, 0, 0, _NR]]
    if arch == _ARCHES["x86_64"][0]:
        program += [[_JGE_K, 0, 1, _X32_BIT], [_RET_K, 0, 0, _RET_KILL_PROCESS]]
    for number in denied:
        program += [[_JEQ_K, 0, 1, number], [_RET_K, 0, 0, errno_perm]]
    program += [[_JEQ_K, 0, 1, numbers["clone3"]], [_RET_K, 0, 0, errno_nosys]]
    # prlimit64(pid != 0, ...): refused (the low 32 bits of pid; a pid is a 32-bit int)
    program += [[_JEQ_K, 0, 4, numbers["prlimit64"]], [_LD_ABS_W, 0, 0, _ARG0], [_JEQ_K, 1, 0, 0]]
    program += [[_RET_K, 0, 0, errno_perm], [_RET_K, 0, 0, _RET_ALLOW]]
    program += [[_JEQ_K, 0, 3, numbers["clone"]], [_LD_ABS_W, 0, 0, _ARG0], [_JSET_K, 0, 1, _CLONE_NEW]]
    program += [[_RET_K, 0, 0, errno_perm], [_RET_K, 0, 0, _RET_ALLOW]]
    return program
