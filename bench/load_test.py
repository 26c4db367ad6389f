#!/usr/bin/env python3
"""Load test for `encore serve` (loopback only, bounded in time).

N clients stream completions for D seconds (each request: one of a few
prompts, its own seed); then every request that was answered is sent again
alone, not streamed, and its output_hash must equal the one it had under
load. Prints requests/s, generated tokens/s, p50/p99 time to first token and
inter-token latency, failures and mismatches; exits 1 on any failure or
mismatch.

  python3 bench/load_test.py --port 8080 --clients 32 --duration 60
"""
import argparse
import http.client
import json
import statistics
import sys
import threading
import time

PROMPTS = [
    "Once upon a time",
    "The little dog ran to the park and",
    "Tom and his mom went to the store. They wanted to buy",
    "One day, a girl named Lily found a shiny",
    "The sun was hot and the water was cold, so",
]


def percentile(values, p):
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def body(prompt, seed, max_tokens, stream):
    b = {"prompt": prompt, "seed": seed, "max_tokens": max_tokens, "temperature": 0.8,
         "stream": stream}
    if stream:  # OpenAI (and encore serve) refuse stream_options without a stream
        b["stream_options"] = {"include_usage": True}
    return json.dumps(b)


def stream_once(port, prompt, seed, max_tokens, timeout):
    """One streamed request: (ok, output_hash, ttft, [gaps], tokens)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    t0 = time.monotonic()
    conn.request("POST", "/v1/completions", body(prompt, seed, max_tokens, True),
                 {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        resp.read()
        conn.close()
        return False, None, None, [], 0
    ttft, last, gaps, out_hash, tokens, buf = None, None, [], None, 0, b""
    while True:
        chunk = resp.read1(65536) if hasattr(resp, "read1") else resp.read(1)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            if not event.startswith(b"data: "):
                continue
            data = event[6:]
            if data == b"[DONE]":
                conn.close()
                return out_hash is not None, out_hash, ttft, gaps, tokens
            j = json.loads(data)
            if "error" in j:
                conn.close()
                return False, None, None, [], 0
            if j.get("usage"):
                tokens = j["usage"]["completion_tokens"]
            for ch in j.get("choices", []):
                now = time.monotonic()
                if ch.get("text"):
                    if ttft is None:
                        ttft = now - t0
                    elif last is not None:
                        gaps.append(now - last)
                    last = now
                if ch.get("finish_reason"):
                    out_hash = ch.get("output_hash")
    conn.close()
    return False, None, None, [], 0


def alone(port, prompt, seed, max_tokens, timeout):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    conn.request("POST", "/v1/completions", body(prompt, seed, max_tokens, False),
                 {"Content-Type": "application/json"})
    resp = conn.getresponse()
    raw = resp.read()
    conn.close()
    try:
        return json.loads(raw)["choices"][0]["output_hash"] if resp.status == 200 else None
    except (ValueError, KeyError, IndexError):  # an error body: counted as a mismatch
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--no-alone", action="store_true",
                    help="skip sending each request again alone (the server's --shadow-rate "
                         "and `encore replay` of its --audit-log check them instead)")
    a = ap.parse_args()

    lock = threading.Lock()
    results = []  # (prompt, seed, ok, hash, ttft, gaps, tokens)
    stop_at = time.monotonic() + a.duration

    def client(c):
        i = 0
        while time.monotonic() < stop_at:
            prompt, seed = PROMPTS[(c + i) % len(PROMPTS)], c * 100000 + i
            try:
                r = stream_once(a.port, prompt, seed, a.max_tokens, a.timeout)
            except Exception:  # a failed request is a result, not a crash
                r = (False, None, None, [], 0)
            with lock:
                results.append((prompt, seed) + r)
            i += 1

    t0 = time.monotonic()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0

    ok = [r for r in results if r[2]]
    failed = len(results) - len(ok)
    ttfts = [r[4] for r in ok if r[4] is not None]
    gaps = [g for r in ok for g in r[5]]
    tokens = sum(r[6] for r in ok)
    mismatches = 0
    for prompt, seed, _, h, *_ in ([] if a.no_alone else ok):  # each again, alone, not streamed
        if alone(a.port, prompt, seed, a.max_tokens, a.timeout) != h:
            mismatches += 1
    report = {
        "clients": a.clients, "duration_s": round(wall, 1), "requests": len(results),
        "failed": failed, "mismatches_vs_alone": mismatches,
        "requests_per_s": round(len(ok) / wall, 3), "tokens_per_s": round(tokens / wall, 2),
        "ttft_p50_ms": round(percentile(ttfts, 50) * 1e3, 1),
        "ttft_p99_ms": round(percentile(ttfts, 99) * 1e3, 1),
        "itl_p50_ms": round(percentile(gaps, 50) * 1e3, 1),
        "itl_p99_ms": round(percentile(gaps, 99) * 1e3, 1),
        "itl_mean_ms": round(statistics.mean(gaps) * 1e3, 1) if gaps else None,
    }
    print(json.dumps(report, indent=1))
    return 1 if failed or mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
