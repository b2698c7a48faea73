"""The engine link's parts (grpo_fast.rollout.link_codec, link_auth, engine_link, async_messages): plain data and
typed messages cross it exactly and nothing else decodes; the handshake turns a wrong secret away on both sides;
an altered, replayed, reflected or transplanted frame is refused; a peer that holds the secret still cannot run
code with a pickle (in the trainer, or through the setup in an engine); and a stranger in the weights' process group
gets a nonce, never a weight."""

from __future__ import annotations

import array
import datetime
import math
import os
import pickle
import random
import socket
import stat
import struct
import threading
import time

import pytest
import torch
import torch.distributed as dist

from grpo_fast.cli import main
from grpo_fast.rollout import link_auth, link_store
from grpo_fast.rollout.async_messages import CONTROL, FROM_ENGINE, Group, Prompt, Ready, Stop, Weights
from grpo_fast.rollout.async_rollouts import EngineSetup, EngineSpec, run_engine
from grpo_fast.rollout.base import SamplingSpec
from grpo_fast.rollout.engine_link import WeightLink
from grpo_fast.rollout.link_auth import (
    LinkRefused,
    accept,
    connect,
    engine_secret,
    read_secret_file,
    write_secret_file,
)
from grpo_fast.rollout.link_codec import LinkProtocolError, decode, encode
from grpo_fast.rollout.link_store import Channel, LinkServer, connect_link
from grpo_fast.rollout.partial import PartialOptions

KEY = b"k" * 32


def _member(n: int, seed: int) -> dict:
    rng = random.Random(seed)
    return {
        "token_ids": [rng.randrange(2**31) for _ in range(n)],
        "logprobs": [-rng.expovariate(1.0) for _ in range(n)],
        "text": "résumé ∑ 🙂 " * 3,
        "segments": [[0, 3], [n // 2, 4]],
        "finish_reason": "length",
    }


def _state(n: int = 40) -> dict:
    return {"row": 7, "prompt_ids": list(range(20)), "members": [_member(n, 0), _member(n, 1)]}


def _bits(x: float) -> bytes:
    return struct.pack("<d", x)


class _CreatesFile:
    def __init__(self, path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


# -- the codec --------------------------------------------------------------------------------------------------


def test_plain_data_crosses_exactly_with_numbers_as_raw_buffers():
    """Ids, logprobs (every float's bits, -inf, nan, -0.0 and subnormals included), masks, bytes, nested extras
    and unicode come back equal; the long numeric lists travel as their raw little-endian buffers, not as text."""
    state = _state()
    odd = [-math.inf, math.nan, -0.0, 5e-324, 1.0000000000000002] + [0.5] * 20
    state["members"][0]["logprobs"][: len(odd)] = odd
    state["members"][0]["sampled"] = [i % 3 != 0 for i in range(40)]
    state["members"][0]["episode"] = {"messages": [{"role": "tool", "content": "42"}], "calls": 1, "ok": None}
    data = {"state": state, "blob": os.urandom(100), "short": [1, 2.5, True], "big": [2**70] * 20}
    back = decode(encode(data))
    assert back["blob"] == data["blob"] and back["big"] == data["big"] and back["short"] == [1, 2.5, True]
    for got, sent in zip(back["state"]["members"], state["members"], strict=True):
        assert got["token_ids"] == sent["token_ids"] and got["segments"] == sent["segments"]
        assert list(map(_bits, got["logprobs"])) == list(map(_bits, sent["logprobs"]))
        assert {k: v for k, v in got.items() if k != "logprobs"} == {k: v for k, v in sent.items() if k != "logprobs"}
    assert type(back["state"]["members"][0]["sampled"][0]) is bool
    raw = encode(data)
    for member in state["members"]:
        assert array.array("q", member["token_ids"]).tobytes() in raw
        assert array.array("d", member["logprobs"]).tobytes() in raw


@pytest.mark.parametrize(
    "value",
    [object(), {1, 2}, torch.zeros(2), print, {"__buffer__": [0, "q"]}, {3: "int key"}, [b"ok", lambda: 0]],
)
def test_only_plain_data_is_encoded(value):
    with pytest.raises(LinkProtocolError, match="cannot cross the engine link"):
        encode({"x": [value]})


def test_a_pickle_or_garbage_never_decodes_to_anything_but_plain_data(tmp_path):
    """A pickle whose loading would create a file, truncations, lying lengths, bad buffer references, deep nesting,
    and a thousand random mutations of a valid message: each is plain data or a LinkProtocolError, and no file."""
    marker = tmp_path / "code_ran"
    with pytest.raises(LinkProtocolError):
        decode(pickle.dumps(_CreatesFile(marker)))
    good = encode(_state())
    header_length = struct.unpack("<I", good[:4])[0]
    crafted = [
        b"",
        good[:3],
        good[:-1],
        good + b"x",
        struct.pack("<I", 10**9) + good[4:],
        _framed(b'[{"__buffer__":[5,"q"]},[]]'),
        _framed(b'[{"__buffer__":[0,"q"]},[3]]') + b"abc",
        _framed(b'[{"__buffer__":[0,"q"],"x":1},[]]'),
        _framed(b'[{"__buffer__":[0,"Z"]},[8]]') + bytes(8),
        _framed(b"[0,[-1]]"),
        _framed(b"[" * 100_000 + b"]" * 100_000),
    ]
    rng = random.Random(0)
    for _ in range(1000):
        blob = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            blob[rng.randrange(len(blob) if rng.random() < 0.5 else 4 + header_length)] = rng.randrange(256)
        crafted.append(bytes(blob))
    refused = 0
    for blob in crafted:
        try:
            _check_plain(decode(blob))
        except LinkProtocolError:
            refused += 1
    assert refused >= len(crafted) // 4
    assert not marker.exists()


def _framed(header: bytes) -> bytes:
    return struct.pack("<I", len(header)) + header


def _check_plain(value) -> None:
    if isinstance(value, dict):
        assert all(isinstance(k, str) for k in value)
        for v in value.values():
            _check_plain(v)
    elif isinstance(value, list):
        for v in value:
            _check_plain(v)
    else:
        assert type(value) in (str, int, float, bool, type(None), bytes), type(value)


def _setup() -> EngineSetup:
    pool = dict(
        options=PartialOptions(segment_tokens=8, groups_in_flight=3.0, correction="mask"),
        num_generations=4,
        max_completion_length=64,
        max_staleness=2,
        stale="drop",
    )
    sampling = SamplingSpec(n=1, max_tokens=9, temperature=0.7, top_k=5, stop_token_ids=(2, 3), seed=None)
    manifest = [("lm_head.weight", (11, 6), torch.bfloat16), ("layers.0.bias", (6,), torch.float32)]
    spec = EngineSpec("vllm", "/models/x", {"dtype": "bfloat16", "seed": 3, "kv_cache_memory_bytes": None})
    return EngineSetup(spec, pool, sampling, 5, 2, "1", 8, manifest, "gloo", 3, 30.0, 2)


def test_the_setup_crosses_typed_and_a_bad_field_is_named():
    setup = _setup()
    assert EngineSetup.from_plain(decode(encode(setup.to_plain()))) == setup
    for change, named in (
        (lambda p: p["manifest"][0].__setitem__(2, "os.system"), r"setup\.manifest\[0\]\[2\]"),
        (lambda p: p["manifest"][1].__setitem__(1, [6.5]), r"setup\.manifest\[1\]\[1\]\[0\]"),
        (lambda p: p["sampling"].__setitem__("top_k", "5"), r"setup\.sampling\.top_k"),
        (lambda p: p["sampling"].__setitem__("stop_token_ids", ["2"]), r"setup\.sampling\.stop_token_ids\[0\]"),
        (lambda p: p["pool_kwargs"]["options"].__setitem__("segment_tokens", 0), r"rollout\.partial\.segment_tokens"),
        (lambda p: p["pool_kwargs"].__setitem__("sampling", {}), r"setup\.pool_kwargs: unknown keyword.*sampling"),
        (lambda p: p.__setitem__("pickled", 1), r"setup: EngineSetup with unknown field\(s\) \['pickled'\]"),
        (lambda p: p.pop("version"), r"missing \['version'\]"),
    ):
        plain = decode(encode(setup.to_plain()))
        change(plain)
        with pytest.raises(LinkProtocolError, match=named):
            EngineSetup.from_plain(plain)


def test_the_links_store_keeps_torchs_store_contract():
    """What torch's own code calls, through a PrefixStore over an engine's view: set, get, add, check, wait,
    compare_set, delete_key, num_keys and clone (pure virtual in c10d::Store) all reach the trainer's store."""
    server = LinkServer("127.0.0.1", 0, KEY, 5.0)
    try:
        remote = connect_link(f"127.0.0.1:{server.port}", KEY, 5.0)  # held: the Python methods live with it
        engine = dist.PrefixStore("p", remote).clone()
        engine.set("a", b"1")
        assert server.store.get("p/a") == b"1" and engine.get("a") == b"1"
        assert engine.add("n", 2) == 2 and server.store.add("p/n", 3) == 5
        assert engine.check(["a", "n"]) and not engine.check(["b"])
        engine.wait(["a"], datetime.timedelta(seconds=1))
        with pytest.raises(Exception, match="not set within 0.2 s"):
            engine.wait(["b"], datetime.timedelta(seconds=0.2))
        assert engine.compare_set("c", "", "x") == b"x" and engine.compare_set("c", "y", "z") == b"x"
        assert engine.num_keys() == 3 and engine.delete_key("c") and not engine.check(["c"])
    finally:
        server.close()


# -- messages ---------------------------------------------------------------------------------------------------


def test_each_queue_carries_its_typed_messages_and_refuses_others():
    server = LinkServer("127.0.0.1", 0, KEY, 5.0)
    try:
        groups = Channel(server.store, "groups", FROM_ENGINE)
        control = Channel(server.store, "control/0", CONTROL)
        sent = [Ready(), Group(_state(), {"generated_tokens": 80, "busy_seconds": 0.25})]
        for message in sent:
            groups.put(message)
        control.put(Weights(3))
        control.put(Stop())
        assert groups.drain() == sent and control.drain() == [Weights(3), Stop()]
        with pytest.raises(TypeError, match="not a message of the link's 'groups' queue"):
            groups.put(Stop())
        server.store.queue_push("groups", encode({"kind": "Stop", "fields": {}}))
        with pytest.raises(LinkProtocolError, match="'groups' queue: expected one of"):
            groups.get_nowait()
    finally:
        server.close()


@pytest.mark.parametrize(
    "change, named",
    [
        (lambda s: s["members"][0]["logprobs"].pop(), r"members\[0\]\.logprobs: 39 items for 40 tokens"),
        (lambda s: s["members"][1].__setitem__("finish_reason", None), r"members\[1\]\.finish_reason"),
        (lambda s: s["members"][0]["token_ids"].__setitem__(3, 1.5), r"members\[0\]\.token_ids"),
        (lambda s: s["members"][0].__setitem__("segments", [[30, 1], [2, 2]]), r"segments: first tokens"),
        (lambda s: s["members"][0].__setitem__("segments", [[0, 1, 2]]), r"segments: expected"),
        (lambda s: s["members"][0].__setitem__("sampled", [True] * 3), r"sampled: 3 items for 40 tokens"),
        (lambda s: s["members"][0].pop("segments"), r"members\[0\]: missing \['segments'\]"),
        (lambda s: s.__setitem__("members", []), r"group\.members: expected a non-empty list"),
        (lambda s: s.__setitem__("row", "7"), r"group\.row: expected an int"),
    ],
)
def test_a_malformed_group_is_refused_naming_its_field(change, named):
    state = _state()
    change(state)
    with pytest.raises(ValueError, match=named):
        Group(state, {})
    plain = {"kind": "Group", "fields": {"state": state, "counts": {}}}
    with pytest.raises(LinkProtocolError, match=named):
        Channel(None, "groups", FROM_ENGINE).decode(encode(plain))


def test_a_group_may_carry_more_plain_data_per_member():
    state = _state()
    state["members"][0]["sampled"] = []
    state["members"][1]["sampled"] = [True] * 40
    state["members"][1]["episode"] = {"messages": [{"role": "assistant", "content": "x"}]}
    assert Group(state, {}).state is state


# -- the handshake and the frames -------------------------------------------------------------------------------


def _pair(server_key: bytes = KEY, client_key: bytes = KEY):
    """(client, server) Connections over a socket pair, or the exceptions each side raised."""
    a, b = socket.socketpair()
    out = {}

    def serve():
        try:
            out["server"] = accept(b, server_key)
        except Exception as exc:  # noqa: BLE001 - inspected by the test
            out["server"] = exc
            b.close()

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        out["client"] = connect(a, client_key, "test:1")
    except Exception as exc:  # noqa: BLE001 - inspected by the test
        out["client"] = exc
    thread.join()
    return out["client"], out["server"]


def test_a_wrong_secret_is_refused_on_both_sides():
    client, server = _pair(client_key=b"w" * 32)
    assert isinstance(server, LinkRefused) and "wrong secret" in str(server)
    assert isinstance(client, LinkRefused) and "refused this engine process" in str(client)
    assert "--secret-file" in str(client)


def test_a_trainer_that_cannot_prove_the_secret_is_not_trusted():
    """The server side of the handshake with another key: the engine sees a trainer that is not its run's."""
    a, b = socket.socketpair()
    thread = threading.Thread(target=lambda: _answer_without_secret(b))
    thread.start()
    with pytest.raises(LinkRefused, match="did not prove it holds the link secret"):
        connect(a, KEY, "test:1")
    thread.join()


def _answer_without_secret(sock: socket.socket) -> None:
    from grpo_fast.rollout.link_auth import MAGIC, NONCE_BYTES, TAG_BYTES

    sock.sendall(MAGIC + os.urandom(NONCE_BYTES))
    sock.recv(len(MAGIC) + NONCE_BYTES + TAG_BYTES)
    sock.sendall(os.urandom(TAG_BYTES))


def _recorded(conn, body: bytes) -> bytes:
    """The bytes `conn` puts on the wire for `body` (counted as sent)."""
    mine, theirs = socket.socketpair()
    real, conn.sock = conn.sock, mine
    conn.send(body)
    conn.sock = real
    return theirs.recv(1 << 16)


@pytest.mark.parametrize("attack", ["altered", "replayed", "reordered", "reflected", "transplanted"])
def test_a_frame_that_was_not_sent_as_it_arrives_is_refused(attack):
    client, server = _pair()
    first = _recorded(client, b"set loaded/0 1")
    if attack == "altered":
        forged = first[:9] + bytes([first[9] ^ 1]) + first[10:]
    elif attack == "replayed":
        client.sock.sendall(first)
        assert server.recv() == b"set loaded/0 1"
        forged = first
    elif attack == "reordered":  # the second frame delivered first
        forged = _recorded(client, b"stop")
    elif attack == "reflected":  # the trainer's own frame sent back to it
        forged = _recorded(server, b"set loaded/0 1")
    else:  # a frame of another connection with the same secret, at the same position
        other_client, _ = _pair()
        forged = _recorded(other_client, b"set loaded/0 1")
    client.sock.sendall(forged)
    with pytest.raises(LinkRefused, match="failed its authentication"):
        server.recv()


def test_the_secret_file_is_private_and_an_open_one_is_refused(tmp_path, monkeypatch):
    path = write_secret_file("ab" * 32)
    try:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert read_secret_file(path) == b"ab" * 32
        os.chmod(path, 0o644)
        with pytest.raises(ValueError, match=r"may be read by other users \(mode 0644\); `chmod 600"):
            read_secret_file(path)
    finally:
        os.unlink(path)
    monkeypatch.delenv("GRPO_FAST_LINK_SECRET", raising=False)
    with pytest.raises(ValueError, match=r"no link secret: pass --secret-file FILE .*\$GRPO_FAST_LINK_SECRET"):
        engine_secret(None)
    monkeypatch.setenv("GRPO_FAST_LINK_SECRET", "short")
    with pytest.raises(ValueError, match=r"\$GRPO_FAST_LINK_SECRET: .*at least 32 characters, got 5"):
        engine_secret(None)


def test_the_engine_command_names_a_missing_secret_before_connecting(monkeypatch, tmp_path):
    monkeypatch.delenv("GRPO_FAST_LINK_SECRET", raising=False)
    with pytest.raises(SystemExit, match="no link secret: pass --secret-file"):
        main(["engine", "--connect", "127.0.0.1:1"])
    with pytest.raises(SystemExit, match=r"--secret-file: cannot read .*nowhere"):
        main(["engine", "--connect", "127.0.0.1:1", "--secret-file", str(tmp_path / "nowhere")])


# -- a peer that holds the secret -------------------------------------------------------------------------------


def test_a_pickled_message_from_a_peer_with_the_secret_runs_no_code(tmp_path):
    """The trainer's group queue given a pickle by an authenticated peer (a compromised engine host): the trainer
    refuses it, naming the queue, and the pickle's code never runs."""
    marker = tmp_path / "code_ran"
    server = LinkServer("127.0.0.1", 0, KEY, 5.0)
    try:
        peer = connect_link(f"127.0.0.1:{server.port}", KEY, 5.0)
        peer.queue_push("groups", pickle.dumps(_CreatesFile(marker)))
        with pytest.raises(LinkProtocolError, match="not a message of the link's 'groups' queue"):
            Channel(server.store, "groups", FROM_ENGINE).get_nowait()
    finally:
        server.close()
    assert not marker.exists()


def test_a_pickled_setup_runs_no_code_in_the_engine(tmp_path):
    marker = tmp_path / "code_ran"
    server = LinkServer("127.0.0.1", 0, KEY, 5.0)
    server.store.set("setup", pickle.dumps(_CreatesFile(marker)))
    try:
        with pytest.raises(LinkProtocolError):
            run_engine(f"127.0.0.1:{server.port}", secret=KEY, connect_seconds=5.0)
    finally:
        server.close()
    assert not marker.exists()


def test_a_stranger_in_the_weights_group_gets_the_nonce_and_no_weight():
    """A peer that takes an engine's place in the weights' process group (its sockets authenticate nobody; here it
    meets through the store to stand for one that reached gloo's port): it receives the link's nonce, but never
    joins through the link, so the trainer sends no weight and fails at its timeout."""
    server = LinkServer("127.0.0.1", 0, KEY, 3.0)
    weight = torch.arange(6.0)
    trainer = WeightLink(server.store, 0, 2, [("w", (6,), torch.float32)], "gloo", "cpu", 3.0)
    failure = {}
    thread = threading.Thread(target=lambda: failure.setdefault("trainer", _raised(trainer.send, [weight])))
    thread.start()
    options = dist.ProcessGroupGloo._Options()
    options._timeout = datetime.timedelta(seconds=8)
    options._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
    stranger = dist.ProcessGroupGloo(dist.PrefixStore("weights", server.store), 1, 2, options)
    nonce = torch.zeros(32, dtype=torch.uint8)
    stranger.broadcast(nonce, 0).wait()
    assert nonce.numpy().tobytes() == server.store.get("link/nonce")
    received = torch.zeros(6)
    with pytest.raises(RuntimeError):
        stranger.broadcast(received, 0).wait()
    thread.join()
    server.close()
    assert isinstance(failure["trainer"], TimeoutError) and "link/joined/1" in str(failure["trainer"])
    assert not received.any()


def _raised(fn, *args):
    try:
        fn(*args)
    except Exception as exc:  # noqa: BLE001 - inspected by the test
        return exc
    return None


def test_a_prompt_with_an_id_that_is_not_an_int_is_refused_naming_it():
    plain = {"kind": "Prompt", "fields": {"row": 3, "prompt_ids": [1, "2"]}}
    with pytest.raises(LinkProtocolError, match=r"Prompt\.prompt_ids\[1\]: expected int"):
        Channel(None, "prompts/0", (Prompt,)).decode(encode(plain))


def test_a_handshake_ends_at_its_deadline_however_slowly_the_peer_writes(monkeypatch):
    """A peer that trickles its reply a byte at a time keeps a handshake slot for HANDSHAKE_SECONDS in all, not for
    that long per byte."""
    monkeypatch.setattr(link_auth, "HANDSHAKE_SECONDS", 0.5)
    trainer, peer = socket.socketpair()
    stop = threading.Event()

    def trickle():
        while not stop.wait(0.1):
            try:
                peer.send(b"g")
            except OSError:
                return

    thread = threading.Thread(target=trickle)
    thread.start()
    start = time.monotonic()
    try:
        with pytest.raises(TimeoutError, match="handshake"):
            accept(trainer, KEY)  # 80 bytes at 10 a second: 8 s
        assert time.monotonic() - start < 4.0
    finally:
        stop.set()
        thread.join()
        trainer.close()
        peer.close()


def test_an_engine_waits_while_strangers_hold_every_handshake_slot(monkeypatch):
    """Idle connections take the trainer's handshake slots; an engine that arrives then is closed ungreeted and
    tries again until the strangers' handshakes time out (it gave up at once, blaming its secret)."""
    monkeypatch.setattr(link_store, "MAX_HANDSHAKES", 2)
    monkeypatch.setattr(link_auth, "HANDSHAKE_SECONDS", 1.0)
    server = LinkServer("127.0.0.1", 0, KEY, 5.0)
    strangers = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(2)]
    try:
        for stranger in strangers:  # greeted: each holds a slot now
            assert stranger.recv(len(link_auth.MAGIC)) == link_auth.MAGIC
        engine = connect_link(f"127.0.0.1:{server.port}", KEY, 30.0)
        engine.set("seen", b"1")
        assert server.store.get("seen") == b"1"
    finally:
        for stranger in strangers:
            stranger.close()
        server.close()


def test_a_port_that_never_greets_ends_the_engines_wait_with_the_cause():
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def close_each():  # what a trainer with every slot taken does
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                listener.accept()[0].close()
            except TimeoutError:
                pass

    thread = threading.Thread(target=close_each)
    thread.start()
    try:
        with pytest.raises(RuntimeError, match="handshake slots stayed taken"):
            connect_link(f"127.0.0.1:{listener.getsockname()[1]}", KEY, 1.0)
    finally:
        stop.set()
        thread.join()
        listener.close()
