"""The first process of every jailed command: it holds the command's whole process tree and kills
all of it when the command ends or the trainer gives up on it.

``python -I -S -c <this file's text> <lifeline> <ready> <seccomp> <no_new_privs_ok> <cgroups> <argv...>``
(stdlib only, and only modules that load in milliseconds: no ``json``, ``signal`` or ``platform``,
which pull in ``enum`` and ``re``; read as text by :mod:`.jail`, never imported by the jailed
side). The arguments:

* ``cgroups``: ``:``-separated cgroup directories to join first (the per-run pids/memory
  cgroups), so that every process of the command is counted there;
* ``lifeline``: the read end of a pipe whose write end only the trainer holds. End of file on it
  (the trainer closed it at the deadline, or the trainer died) means: kill everything now;
* ``seccomp`` (``1``/``0``): install the socket filter (:func:`socket_filter`) in the command's
  process (``no_new_privs_ok``: it may set ``no_new_privs`` to do so, see
  :func:`install_socket_filter`);
* ``ready``: a descriptor to write one byte to (and close) just before the command starts, or
  ``-`` when a later setup step does it (the namespace script announces itself).

The reaper makes itself a *child subreaper* (``PR_SET_CHILD_SUBREAPER``): a process of the command
that double-forks and ``setsid``\\ s -- leaving the process group and the session the trainer could
signal -- is reparented to the reaper, not to init. When the command's own process exits, or the
lifeline closes, the reaper SIGKILLs its children until none is left (children of a killed child
are reparented to it in turn), reaps them, and exits with the command's status (``128 + signal``
for a signal). In the namespace mode the command's first process is the PID namespace's init: once
it is killed, the kernel kills everything else in the namespace.

The seccomp filter makes ``socket(AF_UNIX, ...)`` fail with ``EACCES`` (no connection to any
named or abstract unix socket of the host: a Docker, Ray or X11 socket, an ``nscd``), refuses
``io_uring_setup`` (whose operations would bypass the filter) and every system call of a foreign
ABI (the 32-bit entry points of an x86-64 kernel, which this filter does not decode).
``socketpair`` stays allowed: its two connected ends reach nothing else (asyncio's self-pipe uses
it). It is installed for x86-64 and aarch64 (on other machines, and for a root trainer without
``CAP_SYS_ADMIN`` in the namespace mode, the command runs without it).
"""

import _signal  # the C module: ``signal`` imports ``enum``, 10-30 ms of every command's start
import ctypes
import errno
import os
import select
import struct
import sys
import time

_PR_SET_SECCOMP = 22
_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_NO_NEW_PRIVS = 38
_SECCOMP_MODE_FILTER = 2
_SECCOMP_RET_ALLOW = 0x7FFF0000
_SECCOMP_RET_ERRNO = 0x00050000
_AF_UNIX = 1
_X32_SYSCALL_BIT = 0x40000000
#: machine -> (AUDIT_ARCH_*, __NR_socket, __NR_io_uring_setup)
_ARCHES = {"x86_64": (0xC000003E, 41, 425), "aarch64": (0xC00000B7, 198, 425)}
_SETUP_FAILED = "verl-credit-jail: setup failed:"


def _statement(code, k, jt=0, jf=0):
    return struct.pack("HBBI", code, jt, jf, k)


def socket_filter(machine=None):
    """The classic-BPF seccomp program (bytes of ``struct sock_filter``) for ``machine``, or None
    when this filter does not know the machine's system call numbers."""
    machine = machine or os.uname().machine
    if machine not in _ARCHES:
        return None
    arch, nr_socket, nr_io_uring_setup = _ARCHES[machine]
    load, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_JMP|JGE|K, BPF_RET|K
    deny = _SECCOMP_RET_ERRNO | errno.EPERM
    program = [
        _statement(load, 4),  # seccomp_data.arch
        _statement(jeq, arch, 1, 0),
        _statement(ret, deny),  # a foreign ABI
        _statement(load, 0),  # seccomp_data.nr
    ]
    if machine == "x86_64":
        program += [_statement(jge, _X32_SYSCALL_BIT, 0, 1), _statement(ret, deny)]  # the x32 ABI
    program += [
        _statement(jeq, nr_io_uring_setup, 0, 1),
        _statement(ret, _SECCOMP_RET_ERRNO | errno.ENOSYS),
        _statement(jeq, nr_socket, 0, 3),
        _statement(load, 16),  # seccomp_data.args[0], low 32 bits (little endian): the domain
        _statement(jeq, _AF_UNIX, 0, 1),
        _statement(ret, _SECCOMP_RET_ERRNO | errno.EACCES),
        _statement(ret, _SECCOMP_RET_ALLOW),
    ]
    return b"".join(program)


def install_socket_filter(libc, no_new_privs_ok):
    """Install :func:`socket_filter` in this process (inherited by everything it starts); returns
    whether it is installed. Without ``CAP_SYS_ADMIN`` the kernel wants ``no_new_privs`` first,
    which is only set when ``no_new_privs_ok``: as root, the namespace jail's launch gains its
    capabilities back through an exec in the new user namespace, which ``no_new_privs`` forbids."""
    program = socket_filter()
    if program is None:
        return False
    buffer = ctypes.create_string_buffer(program, len(program))

    class _Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = _Program(len(program) // 8, ctypes.addressof(buffer))
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) == 0:
        return True
    if ctypes.get_errno() != errno.EACCES or not no_new_privs_ok:
        return False
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return False
    return libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) == 0


def _children():
    """Pids whose parent is this process (a scan of /proc: ``task/*/children`` may not exist)."""
    me = os.getpid()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                data = handle.read()
            if int(data[data.rindex(b")") + 2 :].split()[1]) == me:
                found.append(int(name))
        except (OSError, ValueError, IndexError):
            continue
    return found


def kill_descendants(command_pid, statuses):
    """SIGKILL every child until no child is left; wait statuses of ``command_pid`` go to ``statuses``."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid:
            if pid == command_pid:
                statuses.append(status)
            continue
        for child in _children():
            try:
                os.kill(child, _signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.002)


def _wait_for_command(command_pid, lifeline, statuses):
    """Until the command's process exits (True) or the lifeline closes (False)."""
    try:
        watch = os.pidfd_open(command_pid)
    except (AttributeError, OSError):
        watch = None
    try:
        while True:
            fds = [lifeline] if watch is None else [lifeline, watch]
            ready = select.select(fds, [], [], None if watch is not None else 0.02)[0]
            while True:  # reap whatever has exited: the command, and orphans reparented here
                try:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    return True
                if not pid:
                    break
                if pid == command_pid:
                    statuses.append(status)
                    return True
            if lifeline in ready:
                return False
    finally:
        if watch is not None:
            os.close(watch)


def _fail(message):
    try:
        os.write(2, f"{_SETUP_FAILED} {message}\n".encode())
    finally:
        os._exit(125)


def main(argv):
    lifeline, ready, seccomp, no_new_privs_ok, cgroups = argv[1:6]
    command = argv[6:]
    lifeline = int(lifeline)
    libc = ctypes.CDLL(None, use_errno=True)
    for group in [g for g in cgroups.split(":") if g]:
        try:
            with open(os.path.join(group, "cgroup.procs"), "w") as handle:
                handle.write(str(os.getpid()))
        except OSError as exc:
            _fail(f"cannot join the cgroup {group}: {exc}")
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        _fail(f"prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(ctypes.get_errno())}")
    pid = os.fork()
    if pid == 0:
        try:
            os.close(lifeline)
            # Python ignores these at startup; the command gets the defaults (``yes | head`` ends
            # on SIGPIPE, ``ulimit -f`` kills with SIGXFSZ), as subprocess would restore them
            for number in (_signal.SIGPIPE, _signal.SIGXFSZ):
                _signal.signal(number, _signal.SIG_DFL)
            if seccomp == "1":
                install_socket_filter(libc, no_new_privs_ok == "1")
            if ready != "-":  # nothing of the jail's own setup is left: the command starts now
                os.write(int(ready), b"R")
                os.close(int(ready))
            os.execvp(command[0], command)
        except BaseException as exc:
            _fail(f"cannot start {command[0]}: {exc}")
    statuses = []
    _wait_for_command(pid, lifeline, statuses)
    kill_descendants(pid, statuses)
    if not statuses:
        os._exit(137)
    code = os.waitstatus_to_exitcode(statuses[0])
    os._exit(code if code >= 0 else 128 - code)


if __name__ == "__main__":
    main(sys.argv)
