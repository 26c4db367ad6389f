#!/usr/bin/env python3
"""Encore behind HAProxy: 3 replicas sharing one Redis (deploy/local-cluster.sh).

Scenarios (issue 28), all through the balancer on loopback, each bounded in time:
  affinity  30 sessions x 3 turns with X-Session-Id: turn 2+ hits the RAM prefix cache of
            the replica that served turn 1 (>= 95 % of sessions); the same workload without
            the header (round robin) and straight to one replica (direct) for comparison.
  failover  20 sessions x 3 turns; after turn 1 one replica that served a session is
            SIGKILLed; turns 2 and 3 land on the survivors, which restore the moved
            sessions' KV from Redis (encore_requests_restored_total = moved sessions), and
            all 60 answers equal `encore run --session` run one turn per process.
  return    then the killed replica is started again and every session sends turn 4: the
            moved sessions go back to it (consistent hashing) and still answer as
            `encore run --session` does, though its own --state-dir holds their turn 1 only.
  inflight  a long streamed and a long whole answer in flight on a replica that is
            SIGKILLed: both fail at the client (a cut stream, a 502), never look complete.
  redis     Redis stopped: every request still answered, sessions continue from RAM and
            disk, errors counted; Redis back: a session's turn reaches it again.
  rolling   16 clients for 30 s while each replica is restarted in turn
            (local-cluster.sh restart): 0 failed requests, every answer equal to the same
            request answered alone afterwards.

Seeds: turn 1 of a session gives one, later turns none (the server continues the session
with its last seed + 1, as `encore run --session` does).

Exit 0: pass; 1: fail; 77: skipped (haproxy or redis-server missing). Prints the measured
numbers; --summary FILE also writes them as JSON.
"""

import argparse
import csv
import http.client
import io
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

SKIP = 77
HTTP_TIMEOUT = 30  # seconds for any one request
MAX_TOKENS = 12
TEMPERATURE = 1.0
STORY = (" Once upon a time there was a little girl named Lily. She loved to play outside"
         " in the park with her friends.")
FOLLOW_UPS = [" Then her mom said", " The next day, they", " At night, the little girl"]
SESSIONLESS_PROMPTS = ["Tom had a red ball", "The cat sat on the mat and", "One day, a big dog",
                       "Sue and Ben went to the park. They"]


class TestFailure(Exception):
    pass


def check(cond, message):
    if not cond:
        raise TestFailure(message)


# --- HTTP ---------------------------------------------------------------------------------

class Answer:
    """One completion as the client saw it (status, replica, choice, or the error)."""

    def __init__(self, status=0, replica="", body=None, error=""):
        self.status, self.replica, self.body, self.error = status, replica, body or {}, error
        self.extra = None  # what a scenario measured around this request

    @property
    def choice(self):
        choices = self.body.get("choices") or [{}]
        return choices[0]

    @property
    def ok(self):
        return (self.status == 200 and not self.error and
                self.choice.get("finish_reason") in ("length", "stop", "eog", "context"))

    def key(self):
        """What must be identical between two runs of one request."""
        return (self.choice.get("text"), self.choice.get("output_hash"), self.body.get("seed"))

    def describe(self):
        if self.error:
            return f"error {self.error}"
        return f"status {self.status} {json.dumps(self.body)[:300]}"


def request(port, method, path, body=None, headers=None, timeout=HTTP_TIMEOUT):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = json.dumps(body).encode() if body is not None else None
        hdrs = {"Content-Type": "application/json", **(headers or {})}
        conn.request(method, path, body=data, headers=hdrs)
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def complete(port, body, session_header=None, headers=None):
    """POST /v1/completions (whole or streamed); never raises: errors are in the Answer."""
    headers = dict(headers or {})
    if session_header:
        headers["X-Session-Id"] = session_header
    try:
        status, hdrs, raw = request(port, "POST", "/v1/completions", body, headers)
        replica = hdrs.get("X-Encore-Replica") or hdrs.get("x-encore-replica", "")
        if status != 200:
            return Answer(status, replica, {"raw": raw.decode(errors="replace")[:300]})
        if body.get("stream"):
            return Answer(status, replica, *parse_stream(raw.decode()))
        return Answer(status, replica, json.loads(raw))
    except Exception as e:  # a cut connection, a timeout: a failed request
        return Answer(error=f"{type(e).__name__}: {e}")


def parse_stream(text):
    """The streamed events folded into one whole answer's shape; error if incomplete."""
    pieces, finish, out_hash, seed, done = [], None, None, None, False
    for line in text.splitlines():
        if not line.startswith("data: "):
            continue
        data = line[len("data: "):]
        if data == "[DONE]":
            done = True
            continue
        event = json.loads(data)
        if "error" in event:
            return {}, f"stream error event {data[:200]}"
        seed = event.get("seed", seed)
        for c in event.get("choices", []):
            pieces.append(c.get("text") or "")
            finish = c.get("finish_reason") or finish
            out_hash = c.get("output_hash") or out_hash
    if not done:
        return {}, "stream ended without [DONE]"
    choice = {"text": "".join(pieces), "finish_reason": finish, "output_hash": out_hash}
    return {"choices": [choice], "seed": seed}, ""


def metrics(port):
    """/metrics of one replica: {name: value summed over its label sets}."""
    status, _, raw = request(port, "GET", "/metrics", timeout=5)
    check(status == 200, f"/metrics on port {port}: status {status}")
    values = {}
    for line in raw.decode().splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, _, value = line.rpartition(" ")
        name = name_labels.split("{", 1)[0]
        values[name] = values.get(name, 0.0) + float(value)
    return values


def metric(port, name):
    values = metrics(port)
    check(name in values, f"replica on port {port} has no metric {name} in /metrics")
    return values[name]


# --- the cluster --------------------------------------------------------------------------

class Cluster:
    """deploy/local-cluster.sh, and what its DIR/env says."""

    names = ["r1", "r2", "r3"]

    def __init__(self, script, encore, model, workdir, serve_args):
        self.script, self.encore, self.model, self.dir = script, encore, model, workdir
        self.serve_args = serve_args
        self.env = {}

    def run(self, *args, timeout=120):
        env = dict(os.environ, ENCORE_BIN=self.encore, ENCORE_SERVE_ARGS=self.serve_args)
        started = time.monotonic()
        proc = subprocess.run([self.script, *args], env=env, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=timeout)
        check(proc.returncode == 0,
              f"local-cluster.sh {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}")
        if args[0] in ("restart", "kill"):
            print(proc.stdout.rstrip(), flush=True)
        return time.monotonic() - started

    def start(self):
        took = self.run("start", self.model, self.dir)
        with open(os.path.join(self.dir, "env")) as f:
            for line in f:
                k, _, v = line.strip().partition("=")
                self.env[k] = v
        return took

    def stop(self):
        self.run("stop", self.dir)

    @property
    def lb(self):
        return int(self.env["LB_PORT"])

    def port(self, name):  # "r2" -> replica 2's port
        return int(self.env[f"REPLICA_PORT_{name[1:]}"])

    def haproxy_status(self):
        """{"r1": "UP", ...} from the stats socket."""
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(2)
        s.connect(self.env["STATS_SOCKET"])
        s.sendall(b"show stat\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
        s.close()
        rows = csv.DictReader(io.StringIO(data.decode().lstrip("# ")))
        return {r["svname"]: r["status"] for r in rows if r["pxname"] == "encore_replicas"
                and r["svname"] in self.names}

    def wait_queues_empty(self, names, timeout=30):
        """Until every replica named has written its sessions (write queue 0 bytes)."""
        deadline = time.monotonic() + timeout
        while True:
            pending = {n: metric(self.port(n), "encore_state_write_queue_bytes") for n in names}
            if not any(pending.values()):
                return
            check(time.monotonic() < deadline, f"write queues not empty after {timeout}s: {pending}")
            time.sleep(0.05)

    def wait_down(self, name, timeout=15):
        deadline = time.monotonic() + timeout
        while self.haproxy_status().get(name, "").split(" ")[0] != "DOWN":
            check(time.monotonic() < deadline, f"HAProxy did not mark {name} DOWN in {timeout}s")
            time.sleep(0.1)

    def haproxy_retried(self):
        """Requests HAProxy's log shows retried (the retries field of `option httplog`,
        "+N" when redispatched to another server), and the log's request count."""
        retried = requests = 0
        with open(os.path.join(self.dir, "haproxy.log"), errors="replace") as f:
            for line in f:
                if '"POST ' not in line and '"GET ' not in line:
                    continue
                requests += 1
                # ... actconn/feconn/beconn/srv_conn/retries srv_queue/backend_queue "POST ...
                m = re.search(r' \d+/\d+/\d+/\d+/\+?(\d+) \d+/\d+ "', line)
                if m and m.group(1) != "0":
                    retried += 1
        return retried, requests

    def redis_info(self):
        """Redis' used memory and evicted keys (redis-cli INFO)."""
        out = subprocess.run(["redis-cli", "-p", self.env["REDIS_PORT"], "INFO"],
                             capture_output=True, text=True, timeout=10).stdout
        info = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
        return {"used_memory": info.get("used_memory_human", "?").strip(),
                "evicted_keys": int(info.get("evicted_keys", "0")),
                "keys": info.get("db0", "").strip()}

    def total(self, name, replicas=None):
        return sum(metric(self.port(n), name) for n in (replicas or self.names))


# --- sessions -----------------------------------------------------------------------------

def turn_body(session, turn, prompt, seed, seed_every_turn):
    body = {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": TEMPERATURE,
            "session_id": session}
    if turn == 0 or seed_every_turn:
        body["seed"] = seed + (turn if seed_every_turn else 0)
    return body


def conversation(tag, i, turns=3):
    """A session's prompts; the first block (16 tokens) is unique to the session, so no
    session finds another's KV in the prefix cache."""
    return ([f"{tag} story {i}:{STORY}"] + FOLLOW_UPS)[:turns]


def run_sessions(cluster, tag, count, with_header, seed_every_turn, order_seed, on_turn=None,
                 port=None):
    """count sessions x 3 turns through the balancer (or straight to `port`), round by round
    (all turn 1s, then all turn 2s...), sessions in a shuffled order per round. Returns
    {session: [Answer x3]}."""
    rng = random.Random(order_seed)
    sessions = [f"{tag}-{i}" for i in range(count)]
    answers = {s: [] for s in sessions}
    for turn in range(3):
        order = sessions[:]
        rng.shuffle(order)
        for s in order:
            i = int(s.rsplit("-", 1)[1])
            body = turn_body(s, turn, conversation(tag, i)[turn], 1000 + i, seed_every_turn)
            before = on_turn(None) if on_turn else None
            a = complete(port or cluster.lb, body, s if with_header else None)
            if on_turn:
                a.extra = on_turn(before)
            check(a.ok, f"{s} turn {turn + 1}: {a.describe()}")
            answers[s].append(a)
        # KV blocks (and, with --async-session-writes, the session record) are written
        # after the answer: let them land, so that a turn sent to another replica finds
        # them and the counters measure routing, not a race with the writer.
        cluster.wait_queues_empty(cluster.names)
    return answers


def encore_run_reference(encore, model, tag, count, seed_every_turn, workdir, turns=3):
    """The same conversations by `encore run --session`, one process per turn, one fresh
    state directory. Returns {session: [(text, output_hash, seed) per turn]}."""
    state = tempfile.mkdtemp(prefix="ref-state-", dir=workdir)

    def one(i):
        name, out = f"{tag}-{i}", []
        for turn, prompt in enumerate(conversation(tag, i, turns)):
            cmd = [encore, "run", "-m", model, "--state-dir", state, "--session", name,
                   "-p", prompt, "-n", str(MAX_TOKENS), "--temp", str(TEMPERATURE),
                   "-t", "1", "--json"]
            if turn == 0 or seed_every_turn:
                cmd += ["--seed", str(1000 + i + (turn if seed_every_turn else 0))]
            p = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                               timeout=60)
            check(p.returncode == 0, f"encore run {name} turn {turn + 1}: {p.stderr[-500:]}")
            j = json.loads(p.stdout)
            out.append((j["text"], j["output_hash"], j["seed"]))
        return f"{tag}-{i}", out

    with ThreadPoolExecutor(2) as pool:
        return dict(pool.map(one, range(count)))


# --- scenario: affinity -------------------------------------------------------------------

def cache_counters(cluster):
    """Around one request (nothing else running): [blocks found in the prefix cache,
    requests restored from the state tiers], summed over the replicas. Call with None
    before the request, then with what it returned: the request's own counts."""
    names = ("encore_prefix_cache_hit_blocks_total", "encore_requests_restored_total")

    def measure(before):
        now = [sum(v) for v in zip(*([metrics(cluster.port(n)).get(m, 0.0) for m in names]
                                     for n in cluster.names))]
        return now if before is None else [a - b for a, b in zip(now, before)]
    return measure


def prefix_routing(cluster, measure, groups=4, per_group=10):
    """Sessionless requests sharing a long prefix (a system prompt per application): the
    share that finds it in the RAM prefix cache with X-Prefix-Key (one replica per prefix)
    and without (round robin), in the same shuffled order."""
    out = {}
    for mode, with_key in (("prefix_key", True), ("round_robin", False)):
        reqs = [(g, k) for g in range(groups) for k in range(per_group)]
        random.Random(11).shuffle(reqs)
        hits = 0
        for g, k in reqs:
            body = {"prompt": f"{mode} app {g}:{STORY}{STORY} Question {k}:",
                    "max_tokens": 4, "temperature": TEMPERATURE, "seed": k}
            headers = {"X-Prefix-Key": f"{mode}-app-{g}"} if with_key else {}
            before = measure(None)
            try:
                status, _, raw = request(cluster.lb, "POST", "/v1/completions", body, headers)
            except OSError as e:
                raise TestFailure(f"prefix routing request: {e}")
            check(status == 200, f"prefix routing: status {status} {raw[:200]!r}")
            hit_blocks, restored = measure(before)
            hits += hit_blocks > 0 and restored == 0
        out[mode] = {"requests": len(reqs), "prefixes": groups, "ram_hits": hits,
                     "ram_hit_ratio": round(hits / len(reqs), 3)}
    print(f"prefix routing ({groups} shared prefixes x {per_group} requests, no session): RAM "
          f"prefix-cache hits with X-Prefix-Key {out['prefix_key']['ram_hits']}/{groups * per_group}"
          f", round robin {out['round_robin']['ram_hits']}/{groups * per_group}", flush=True)
    return out


def scenario_affinity(cluster, opts, summary):
    """RAM prefix-cache hits on turns 2+ with and without X-Session-Id. Requests go one at a
    time, so the counters' change around a request is that request's: a RAM hit found
    cached blocks (encore_prefix_cache_hit_blocks_total) and restored none from the state
    tiers (encore_requests_restored_total; restored blocks also count as cache hits)."""
    result = {}
    measure = cache_counters(cluster)

    # direct: one replica without the balancer, the best a cache can do.
    for mode, with_header, port in (("affinity", True, None), ("round_robin", False, None),
                                    ("direct", False, cluster.port("r2"))):
        answers = run_sessions(cluster, f"aff-{mode}", opts.affinity_sessions, with_header,
                               opts.seed_every_turn, order_seed=7, on_turn=measure, port=port)

        def ram_hit(a):
            hit_blocks, restored = a.extra
            return hit_blocks > 0 and restored == 0

        later = [a for turns in answers.values() for a in turns[1:]]
        ram_turns = sum(1 for a in later if ram_hit(a))
        restored_turns = sum(1 for a in later if a.extra[1] > 0)
        cached_turns = sum(1 for a in later
                           if a.body["usage"]["prompt_tokens_details"]["cached_tokens"] > 0)
        ram_sessions = sum(1 for turns in answers.values() if all(ram_hit(a) for a in turns[1:]))
        same_replica = sum(1 for turns in answers.values()
                           if len({a.replica for a in turns}) == 1)
        n = len(answers)
        result[mode] = {
            "sessions": n,
            "sessions_ram_hit_every_later_turn": ram_sessions,
            "session_ram_hit_ratio": round(ram_sessions / n, 3),
            "later_turns": len(later),
            "later_turns_ram_hit": ram_turns,
            "later_turns_restored_from_state_tiers": restored_turns,
            "later_turns_usage_cached_tokens_gt0": cached_turns,
            "sessions_on_one_replica": same_replica,
        }
        print(f"affinity[{mode}]: {ram_sessions}/{n} sessions hit the RAM prefix cache on every "
              f"later turn ({100 * ram_sessions / n:.1f} %); later turns: {ram_turns}/{len(later)} "
              f"RAM hits, {restored_turns} restored from the state tiers, {cached_turns} with "
              f"usage cached_tokens > 0 (RAM or tiers); {same_replica}/{n} sessions stayed on "
              f"one replica", flush=True)
    result["prefix"] = prefix_routing(cluster, measure)
    summary["affinity"] = result
    ratio = result["affinity"]["session_ram_hit_ratio"]
    check(ratio >= 0.95, f"session affinity: RAM hit ratio {ratio:.2f} < 0.95")
    # With the key, only each prefix's first request misses.
    prefix = result["prefix"]["prefix_key"]
    check(prefix["ram_hits"] == prefix["requests"] - prefix["prefixes"],
          f"X-Prefix-Key routing: {prefix['ram_hits']} RAM hits, expected "
          f"{prefix['requests'] - prefix['prefixes']}")


# --- scenario: failover -------------------------------------------------------------------

def scenario_return(cluster, opts, summary):
    """After failover: the killed replica is back (the main loop restarted it). Turn 4 of
    every session: consistent hashing sends the moved sessions back to it, and their answers
    must still equal `encore run --session` - the replica's own --state-dir holds their
    turn-1 record, older than the turns 2 and 3 the survivors wrote to Redis."""
    ctx = opts.context.get("failover")
    check(ctx is not None, "the return scenario needs the failover scenario before it")
    tag, victim = ctx["tag"], ctx["victim"]
    differ, misplaced, not_back = [], [], []
    for i, s in enumerate(ctx["sessions"]):
        body = turn_body(s, 3, conversation(tag, i, 4)[3], 1000 + i, opts.seed_every_turn)
        a = complete(cluster.lb, body, s)
        check(a.ok, f"return {s} turn 4: {a.describe()}")
        if s in ctx["moved"]:
            if a.replica != victim:
                not_back.append(f"{s} on {a.replica}")
        elif a.replica != ctx["replica"][s]:
            misplaced.append(f"{s}: {ctx['replica'][s]} -> {a.replica}")
        if a.key() != ctx["reference"][s][3]:
            differ.append(f"{s} turn 4 on {a.replica} ({'moved back' if s in ctx['moved'] else 'stayed'}):"
                          f" cluster {a.key()} vs encore run {ctx['reference'][s][3]}")
    summary["return"] = {"sessions": len(ctx["sessions"]), "moved_back": len(ctx["moved"]) - len(not_back),
                         "turn4_differing_from_encore_run": len(differ)}
    print(f"return: {victim} restarted; {len(ctx['moved']) - len(not_back)}/{len(ctx['moved'])} "
          f"moved sessions came back to it; {len(differ)}/{len(ctx['sessions'])} turn-4 answers "
          f"differ from encore run --session", flush=True)
    check(not not_back and not misplaced,
          f"consistent hashing: not back on {victim}: {not_back}; moved: {misplaced}")
    check(not differ, "turn 4 differs:\n  " + "\n  ".join(differ[:10]))


def scenario_failover(cluster, opts, summary):
    """SIGKILL a replica between turn 1 and turn 2; answers equal an uninterrupted run."""
    tag, count = "fo", opts.failover_sessions
    sessions = [f"{tag}-{i}" for i in range(count)]
    started = time.monotonic()

    def send(turn):
        out = {}
        for i, s in enumerate(sessions):
            body = turn_body(s, turn, conversation(tag, i)[turn], 1000 + i, opts.seed_every_turn)
            a = complete(cluster.lb, body, s)
            check(a.ok, f"failover {s} turn {turn + 1}: {a.describe()}")
            out[s] = a
        return out

    first = send(0)
    # No wait for the write queues: a session's answer ends only once its turn is written
    # (engine default; --async-session-writes would lose turns here), so the kill may come
    # right after the last answer.
    served = {}
    for s, a in first.items():
        served.setdefault(a.replica, []).append(s)
    victim = max(served, key=lambda n: len(served[n]))  # the replica with most sessions
    survivors = [n for n in cluster.names if n != victim]
    restored_before = cluster.total("encore_requests_restored_total", survivors)
    killed_at = time.monotonic()
    cluster.run("kill", cluster.dir, victim[1:])
    cluster.wait_down(victim)
    down_after = time.monotonic() - killed_at
    second, third = send(1), send(2)
    restored = cluster.total("encore_requests_restored_total", survivors) - restored_before

    moved = served[victim]
    stayed = [s for s in sessions if s not in moved]
    # Consistent hashing: only the victim's sessions move; the others keep their replica.
    for s in stayed:
        check(second[s].replica == first[s].replica == third[s].replica,
              f"{s} moved from {first[s].replica} to {second[s].replica}/{third[s].replica} "
              f"though {first[s].replica} survived")
    for s in moved:
        check(second[s].replica in survivors and third[s].replica == second[s].replica,
              f"moved session {s}: turn 2 on {second[s].replica}, turn 3 on {third[s].replica}")

    reference = encore_run_reference(cluster.encore, cluster.model, tag, count,
                                     opts.seed_every_turn, cluster.dir, turns=4)
    opts.context["failover"] = {"tag": tag, "sessions": sessions, "victim": victim,
                                "moved": served[victim], "reference": reference,
                                "replica": {s: third[s].replica for s in sessions}}
    differ = []
    for s in sessions:
        got = [first[s].key(), second[s].key(), third[s].key()]
        for turn in range(3):
            if got[turn] != reference[s][turn]:
                differ.append(f"{s} turn {turn + 1}: cluster {got[turn]} vs encore run "
                              f"{reference[s][turn]}")
    summary["failover"] = {
        "sessions": count, "answers": 3 * count, "victim": victim,
        "sessions_per_replica_turn1": {n: len(v) for n, v in sorted(served.items())},
        "moved_sessions": len(moved), "restored_requests_on_survivors": restored,
        "answers_differing_from_encore_run": len(differ),
        "seconds_from_kill_to_haproxy_down": round(down_after, 2),
        "seconds": round(time.monotonic() - started, 1),
    }
    print(f"failover: turn 1 per replica {summary['failover']['sessions_per_replica_turn1']}; "
          f"killed {victim} (HAProxy marked it DOWN after {down_after:.1f} s); "
          f"{len(moved)} sessions moved, {len(stayed)} stayed; survivors' "
          f"encore_requests_restored_total +{restored:g}; {len(differ)}/{3 * count} answers "
          f"differ from encore run --session", flush=True)
    check(not differ, "answers differ from encore run --session:\n  " + "\n  ".join(differ[:10]))
    check(restored == len(moved),
          f"restored requests on the survivors {restored:g} != moved sessions {len(moved)}")


# --- scenario: a replica killed with requests in flight -----------------------------------

def scenario_inflight(cluster, opts, summary):
    """A long streamed and a long whole answer are in flight on one replica when it is
    SIGKILLed: each fails at the client (a cut stream without [DONE], or an error status),
    never a partial answer that looks complete; HAProxy does not run them again elsewhere."""
    body = {"prompt": "Once upon a time", "max_tokens": 400, "n": 32, "ignore_eos": True,
            "seed": 5, "temperature": TEMPERATURE}
    conn = http.client.HTTPConnection("127.0.0.1", cluster.lb, timeout=HTTP_TIMEOUT)
    conn.request("POST", "/v1/completions", body=json.dumps(dict(body, stream=True)),
                 headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    check(resp.status == 200, f"inflight: stream status {resp.status}")
    victim = resp.getheader("X-Encore-Replica", "")
    check(victim in cluster.names, f"inflight: no X-Encore-Replica header ({victim!r})")
    first = resp.read1(65536).decode(errors="replace")
    check(first.startswith("data: "), f"inflight: no first event: {first[:200]!r}")
    # A whole answer on the same replica: routed by an X-Prefix-Key that hashes to it
    # (found by trying a few; requests without a key go round robin).
    whole, key = {}, None
    for k in range(100):
        probe = complete(cluster.lb, {"prompt": "Tom", "max_tokens": 1},
                         headers={"X-Prefix-Key": f"if-{k}"})
        if probe.ok and probe.replica == victim:
            key = f"if-{k}"
            break
    check(key is not None, f"inflight: no X-Prefix-Key routed to {victim}")

    def send_whole():
        whole["answer"] = complete(cluster.lb, body, headers={"X-Prefix-Key": key})

    t = threading.Thread(target=send_whole)
    t.start()
    # Both in flight on the victim (3 s of work each here) before it dies.
    deadline = time.monotonic() + 10
    while metric(cluster.port(victim), "encore_requests_in_flight") < 2:
        check(time.monotonic() < deadline, "inflight: the whole answer never reached the victim")
        time.sleep(0.02)
    cluster.run("kill", cluster.dir, victim[1:])
    cluster.wait_down(victim)
    rest, cut = "", False
    try:
        while chunk := resp.read1(65536):
            rest += chunk.decode(errors="replace")
    except (http.client.IncompleteRead, ConnectionError, OSError):
        cut = True
    conn.close()
    t.join(HTTP_TIMEOUT + 5)
    stream_text = first + rest
    finished = stream_text.count('"finish_reason":"')
    done = "data: [DONE]" in stream_text
    w = whole.get("answer")
    print(f"inflight: killed {victim} mid-answer; stream: cut {cut}, [DONE] {done}, "
          f"{finished}/32 choices finished; whole answer: "
          f"{w.describe()[:120] if w else 'none'}", flush=True)
    summary["inflight"] = {"victim": victim, "stream_cut": cut, "stream_done": done,
                           "whole_status": w.status if w else None,
                           "whole_error": (w.error[:80] if w else "")}
    check(not done and finished < 32, "the cut stream looks complete")
    check(w is not None and not w.ok, f"the whole answer looks complete: {w and w.describe()}")
    check(w.status != 200 or w.error, f"the whole answer came back 200 and parsed: {w.describe()}")


# --- scenario: Redis down and back --------------------------------------------------------

def scenario_redis(cluster, opts, summary):
    """Redis stops: every replica goes on serving (sessions continue from RAM and their own
    state directory), counts the errors, and writes to Redis again once it is back."""
    tag, count = "rd", 8
    errors_before = cluster.total("encore_redis_errors_total")
    cluster.run("redis-stop", cluster.dir)
    continued, failed = 0, []
    for i in range(count):
        s = f"{tag}-{i}"
        for turn in range(2):
            body = turn_body(s, turn, conversation(tag, i)[turn], 2000 + i, opts.seed_every_turn)
            a = complete(cluster.lb, body, s)
            if not a.ok:
                failed.append(f"{s} turn {turn + 1}: {a.describe()}")
            elif turn == 1 and a.body.get("session_continued"):
                continued += 1
    errors = cluster.total("encore_redis_errors_total") - errors_before
    cluster.run("redis-start", cluster.dir)
    # Back: within the replicas' retry interval (1 s) writes reach Redis again; a new
    # session's answer ends once its turn is written, so its key is there when it comes.
    found, deadline = False, time.monotonic() + 15
    k = 0
    while not found and time.monotonic() < deadline:
        s = f"{tag}-back-{k}"
        a = complete(cluster.lb, turn_body(s, 0, conversation(tag, 100 + k)[0], 1, False), s)
        check(a.ok, f"after Redis returned: {a.describe()}")
        out = subprocess.run(["redis-cli", "-p", cluster.env["REDIS_PORT"], "--scan",
                              "--pattern", f"*:session/{s}"], capture_output=True, text=True,
                             timeout=10).stdout
        found = bool(out.strip())
        k += 1
        if not found:
            time.sleep(0.5)
    summary["redis_outage"] = {"requests": 2 * count, "failed": len(failed),
                               "turn2_continued": continued, "redis_errors_counted": errors,
                               "writes_resumed": found, "sessions_until_resumed": k}
    print(f"redis outage: {2 * count} requests, {len(failed)} failed, {continued}/{count} "
          f"turn 2s continued their session, encore_redis_errors_total +{errors:g}; Redis "
          f"back: session {k} written to it: {found}", flush=True)
    check(not failed, "requests failed while Redis was down:\n  " + "\n  ".join(failed[:5]))
    check(continued == count, f"only {continued}/{count} sessions continued without Redis")
    check(errors > 0, "no Redis error was counted while it was down")
    check(found, "no session reached Redis within 15 s of its return")


# --- scenario: rolling restart ------------------------------------------------------------

class LoadClient(threading.Thread):
    """Sends requests back to back until told to stop: sessionless ones (a seed each, one
    in four streamed) and 3-turn sessions of its own, alternately."""

    def __init__(self, cluster, index, stop, seed_every_turn):
        super().__init__(daemon=True)
        self.cluster, self.index, self.stop_event = cluster, index, stop
        self.seed_every_turn = seed_every_turn
        self.rng = random.Random(index)
        self.records = []  # ("single", body, Answer) or ("session", [(body, Answer)...])

    def run(self):
        k = 0
        while not self.stop_event.is_set():
            if k % 2 == 0:
                self.single(k)
            else:
                self.session(k)
            k += 1

    def single(self, k):
        body = {"prompt": self.rng.choice(SESSIONLESS_PROMPTS), "max_tokens": MAX_TOKENS,
                "temperature": TEMPERATURE, "seed": self.rng.randrange(1 << 31),
                "stream": k % 4 == 0}
        self.records.append(("single", body, complete(self.cluster.lb, body)))

    def session(self, k):
        name = f"roll-c{self.index}-{k}"
        turns = []
        for turn, prompt in enumerate(conversation(f"roll c{self.index}", k)):
            body = turn_body(name, turn, prompt, 5000 + 1000 * self.index + k,
                             self.seed_every_turn)
            a = complete(self.cluster.lb, body, name)
            turns.append((body, a))
            if not a.ok or self.stop_event.is_set():
                break
        self.records.append(("session", turns))


def replay_alone(record, port):
    """The same request(s) again, on one replica with nothing else running: a list of
    (label, what the load got, what alone gives)."""
    if record[0] == "single":
        _, body, got = record
        alone = complete(port, dict(body, stream=False))
        label = f"sessionless seed {body['seed']} stream {body['stream']} {body['prompt']!r}"
        return [(label, got, alone)]
    out, turns = [], record[1]
    session = turns[0][0]["session_id"]
    name = "alone-" + session
    path = ",".join(got.replica or "-" for _, got in turns)
    for t, (body, got) in enumerate(turns):
        alone = complete(port, dict(body, session_id=name), name)
        out.append((f"{session} turn {t + 1} (replicas {path})", got, alone))
    return out


class QueueSampler(threading.Thread):
    """The largest encore_state_write_queue_bytes seen on each replica (every 0.25 s)."""

    def __init__(self, cluster, stop):
        super().__init__(daemon=True)
        self.cluster, self.stop_event, self.peak = cluster, stop, {}

    def run(self):
        while not self.stop_event.wait(0.25):
            for n in self.cluster.names:
                try:
                    v = metrics(self.cluster.port(n)).get("encore_state_write_queue_bytes", 0)
                except Exception:  # restarting: no answer
                    continue
                self.peak[n] = max(self.peak.get(n, 0), v)


def scenario_rolling(cluster, opts, summary):
    stop = threading.Event()
    clients = [LoadClient(cluster, i, stop, opts.seed_every_turn) for i in range(opts.clients)]
    sampler = QueueSampler(cluster, stop)
    retried_before, _ = cluster.haproxy_retried()
    started = time.monotonic()
    for c in clients + [sampler]:
        c.start()
    restarts = []
    try:
        time.sleep(min(3, opts.load_seconds / 10))
        for n in cluster.names:
            at = time.monotonic() - started
            took = cluster.run("restart", cluster.dir, n[1:], timeout=120)
            restarts.append({"replica": n, "at_s": round(at, 1), "took_s": round(took, 1)})
            time.sleep(1)
        remaining = opts.load_seconds - (time.monotonic() - started)
        if remaining > 0:
            time.sleep(remaining)
    finally:
        stop.set()
        for c in clients:
            c.join(timeout=HTTP_TIMEOUT + 5)
    load_seconds = time.monotonic() - started
    check(not any(c.is_alive() for c in clients), "a load client did not finish")

    records = [r for c in clients for r in c.records]
    answers = [a for r in records for a in ([r[2]] if r[0] == "single" else [t[1] for t in r[1]])]
    failed = [a for a in answers if not a.ok]
    per_replica = {}
    for a in answers:
        per_replica[a.replica or "-"] = per_replica.get(a.replica or "-", 0) + 1

    # Alone: every request again, on a quiet cluster, straight to a replica (spread over
    # the three, a few at a time: each replica still runs one request per step alone).
    cluster.wait_queues_empty(cluster.names)
    replay_started = time.monotonic()
    ports = [cluster.port(n) for n in cluster.names]
    with ThreadPoolExecutor(6) as pool:
        triples = [t for ts in pool.map(lambda ir: replay_alone(ir[1], ports[ir[0] % 3]),
                                        enumerate(records)) for t in ts]
    replay_seconds = time.monotonic() - replay_started
    differ = [(label, got, alone) for label, got, alone in triples
              if got.ok and (not alone.ok or got.key() != alone.key())]
    singles = sum(1 for r in records if r[0] == "single")
    session_turns = len(answers) - singles
    retried = cluster.haproxy_retried()[0] - retried_before
    hops = sum(1 for r in records if r[0] == "session"
               for (_, a), (_, b) in zip(r[1], r[1][1:]) if a.replica != b.replica)
    # A later turn that found no saved session starts a new one (session_continued false).
    not_continued = sum(1 for r in records if r[0] == "session" for _, a in r[1][1:]
                        if a.ok and a.body.get("session_continued") is False)
    summary["rolling_restart"] = {
        "clients": opts.clients, "load_seconds": round(load_seconds, 1),
        "requests": len(answers), "sessionless": singles, "session_turns": session_turns,
        "failed": len(failed), "differ_from_alone": len(differ),
        "later_session_turns_not_continued": not_continued,
        "session_turns_on_another_replica_than_the_last": hops,
        "retried_by_haproxy": retried,
        "peak_write_queue_mib": {n: round(v / 2**20, 1) for n, v in sorted(sampler.peak.items())},
        "differ_sessionless": sum(1 for d in differ if d[0].startswith("sessionless")),
        "requests_per_second": round(len(answers) / load_seconds, 1),
        "answers_per_replica": dict(sorted(per_replica.items())),
        "restarts": restarts, "replay_alone_seconds": round(replay_seconds, 1),
        "redis": cluster.redis_info(),
    }
    print(f"rolling restart: {len(answers)} requests ({singles} sessionless, {session_turns} "
          f"session turns) from {opts.clients} clients in {load_seconds:.1f} s "
          f"({len(answers) / load_seconds:.0f}/s); restarts {restarts}; answers per replica "
          f"{dict(sorted(per_replica.items()))}; failed {len(failed)}; differ from alone "
          f"{len(differ)}; session turns on another replica than the last {hops}; later turns "
          f"that found no saved session {not_continued}; retried by HAProxy {retried}; "
          f"peak write queue MiB {summary['rolling_restart']['peak_write_queue_mib']} "
          f"(replayed alone in {replay_seconds:.1f} s); redis "
          f"{summary['rolling_restart']['redis']}", flush=True)
    problems = [f"failed: {label}: {got.describe()}" for label, got, _ in triples if not got.ok]
    problems += [f"differs: {label}: load {g.key()} on {g.replica} vs alone "
                 f"{a.key() if a.ok else a.describe()}" for label, g, a in differ]
    check(not problems, f"{len(failed)} failed, {len(differ)} differ from alone:\n  " +
          "\n  ".join(problems[:20]))


# --- main ---------------------------------------------------------------------------------

def find_haproxy():
    """As deploy/local-cluster.sh finds it: HAPROXY_BIN, PATH, /usr/sbin/haproxy."""
    if os.environ.get("HAPROXY_BIN"):
        path = os.environ["HAPROXY_BIN"]
        return path if os.path.isfile(path) and os.access(path, os.X_OK) else None
    if shutil.which("haproxy"):
        return shutil.which("haproxy")
    return "/usr/sbin/haproxy" if os.access("/usr/sbin/haproxy", os.X_OK) else None


def parse_args():
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--encore", required=True, help="the encore binary")
    p.add_argument("--model", required=True, help="a small model, e.g. stories260K.gguf")
    p.add_argument("--cluster-script", default=os.path.join(here, "..", "..", "deploy", "local-cluster.sh"))
    p.add_argument("--scenarios", default="affinity,failover,return,inflight,redis,rolling")
    p.add_argument("--affinity-sessions", type=int, default=30)
    p.add_argument("--failover-sessions", type=int, default=20)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--load-seconds", type=float, default=30)
    p.add_argument("--serve-args", default="-t 1 --kv-mem 256 --shutdown-grace 10 --shutdown-delay 3",
                   help="extra encore serve flags for every replica")
    p.add_argument("--seed-every-turn", action="store_true",
                   help="send a seed on every turn (servers before seeds continued sessions)")
    p.add_argument("--summary", help="write the numbers measured as JSON to this file")
    p.add_argument("--deadline", type=float, default=250,
                   help="seconds after which the test stops the cluster and fails (under "
                        "ctest's 300 s timeout, whose SIGKILL would leave the cluster running)")
    p.add_argument("--keep", action="store_true", help="keep the cluster directory (logs)")
    p.add_argument("--skip-missing-model", action="store_true",
                   help="skip (exit 77) instead of failing when --model is missing")
    return p.parse_args()


def main():
    opts = parse_args()
    opts.context = {}  # what one scenario leaves for the next (failover -> return)
    missing = [n for n, path in (("haproxy", find_haproxy()), ("redis-server", shutil.which("redis-server")))
               if not path]
    if missing:
        print(f"SKIP: {', '.join(missing)} not installed (scripts/setup.sh installs them)")
        return SKIP
    if not os.path.exists(opts.model) and opts.skip_missing_model:
        print(f"SKIP: test data missing (ENCORE_SKIP_SHARED_TESTS=ON): {opts.model}")
        return SKIP
    for path, what in ((opts.encore, "--encore"), (opts.model, "--model")):
        if not os.path.exists(path):
            print(f"FAIL: {what} {path} does not exist (set -DENCORE_SHARED_DIR=PATH, or "
                  f"-DENCORE_SKIP_SHARED_TESTS=ON to skip data tests)")
            return 1

    # A Ctrl-C or SIGTERM must still stop the cluster: leave through `finally`. ctest's own
    # timeout sends SIGKILL, which would orphan it: a watchdog stops it first.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("terminated"))
    workdir = tempfile.mkdtemp(prefix="encore-cluster-")
    cluster = Cluster(os.path.abspath(opts.cluster_script), os.path.abspath(opts.encore),
                      os.path.abspath(opts.model), workdir, opts.serve_args)

    def past_deadline():
        print(f"FAIL: still running after {opts.deadline} s: stopping the cluster", flush=True)
        try:
            cluster.stop()
        finally:
            os._exit(1)

    watchdog = threading.Timer(opts.deadline, past_deadline)
    watchdog.daemon = True
    watchdog.start()
    summary, failures, started = {}, [], time.monotonic()
    scenarios = {"affinity": scenario_affinity, "failover": scenario_failover,
                 "return": scenario_return, "inflight": scenario_inflight,
                 "redis": scenario_redis, "rolling": scenario_rolling}
    try:
        summary["cluster_start_seconds"] = round(cluster.start(), 1)
        print(f"cluster up in {summary['cluster_start_seconds']} s: {workdir}", flush=True)
        for name in opts.scenarios.split(","):
            t0 = time.monotonic()
            try:
                scenarios[name](cluster, opts, summary)
                print(f"PASS {name} ({time.monotonic() - t0:.1f} s)", flush=True)
            except Exception as e:  # TestFailure, or e.g. a refused connection: this one fails
                failures.append(name)
                print(f"FAIL {name}: {type(e).__name__}: {e}", flush=True)
            # Bring a killed replica back for what follows (its pid file went with it;
            # HAProxy may not have marked it DOWN yet).
            for n in cluster.names:
                if not os.path.exists(os.path.join(cluster.dir, n, "encore.pid")):
                    cluster.run("restart", cluster.dir, n[1:])
    except (TestFailure, subprocess.TimeoutExpired) as e:
        failures.append("setup")
        print(f"FAIL: {e}", flush=True)
    finally:
        try:
            cluster.stop()
        except Exception as e:  # keep the first failure's message; still report this one
            failures.append("stop")
            print(f"FAIL: stopping the cluster: {e}", flush=True)
        watchdog.cancel()
    summary["total_seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps(summary, indent=1))
    if opts.summary:
        with open(opts.summary, "w") as f:
            json.dump(summary, f, indent=1)
    if failures or opts.keep:
        print(f"cluster directory kept: {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    print("FAIL" if failures else "PASS", f"({summary['total_seconds']} s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
