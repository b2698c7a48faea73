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

# The system calls' numbers from the kernel's unistd tables, one per line: the denied calls, then the three whose
# arguments the filter reads or that it answers apart (clone, clone3, prlimit64).
_TABLE = """
name               x86_64 aarch64
ptrace                101     117
process_vm_readv      310     270
process_vm_writev     311     271
kcmp                  312     272
bpf                   321     280
perf_event_open       298     241
userfaultfd           323     282
io_uring_setup        425     425
io_uring_enter        426     426
io_uring_register     427     427
keyctl                250     219
add_key               248     217
request_key           249     218
fanotify_init         300     262
lookup_dcookie        212      18
open_by_handle_at     304     265
name_to_handle_at     303     264
mount                 165      40
umount2               166      39
pivot_root            155      41
chroot                161      51
open_tree             428     428
move_mount            429     429
fsopen                430     430
fsconfig              431     431
fsmount               432     432
fspick                433     433
mount_setattr         442     442
unshare               272      97
setns                 308     268
reboot                169     142
kexec_load            246     104
kexec_file_load       320     294
init_module           175     105
finit_module          313     273
delete_module         176     106
swapon                167     224
swapoff               168     225
acct                  163      89
quotactl              179      60
syslog                103     116
settimeofday          164     170
clock_settime         227     112
adjtimex              159     171
clock_adjtime         305     266
vhangup               153      58
shmget                 29     194
shmat                  30     196
shmctl                 31     195
shmdt                  67     197
msgget                 68     186
msgsnd                 69     189
msgrcv                 70     188
msgctl                 71     187
semget                 64     190
semop                  65     193
semtimedop            220     192
semctl                 66     191
clone                  56     220
clone3                435     435
prlimit64             302     261
"""
_NUMBERS = {name: (int(x86), int(arm)) for name, x86, arm in (row.split() for row in _TABLE.strip().splitlines()[1:])}
_DENIED = list(_NUMBERS)[:-3]
_ARCHES = {"x86_64": (0xC000003E, 0), "aarch64": (0xC00000B7, 1)}  # AUDIT_ARCH_*, the column of _NUMBERS

_LD_ABS_W, _JEQ_K, _JGE_K, _JSET_K, _RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
_RET_ALLOW, _RET_KILL_PROCESS, _RET_ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
_EPERM, _ENOSYS = 1, 38
_CLONE_NEW = 0x20000 | 0x80 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
_X32_BIT = 0x40000000
_NR, _ARCH, _ARG0 = 0, 4, 16  # offsets in struct seccomp_data (args[0]'s low 32 bits on little endian)


def denylist_filter(machine: str | None = None) -> list[list[int]] | None:
    """The filter for `machine` (default: this one), or None for an architecture it does not know."""
    arch, column = _ARCHES.get(machine or platform.machine(), (None, None))
    if arch is None:
        return None
    numbers = {name: both[column] for name, both in _NUMBERS.items()}
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
