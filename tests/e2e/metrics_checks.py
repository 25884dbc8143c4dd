#!/usr/bin/env python3
"""The metrics of `llmtrain train` against a real Prometheus, and the exporter under abuse.

metrics_checks.py CHECK SCRATCH LLMTRAIN [MPIEXEC PROMETHEUS RULES PROMTOOL DASHBOARD RULES_TEST FAKE_NVML_DIR]

  scraped-run   (fixture) a Prometheus on 127.0.0.1 (free port, its own data directory) scrapes
                a 2-rank `mpirun llmtrain train` found through the run's metrics_targets.json
                (metrics.port = 0) and evaluates the alert rules every second; Prometheus stays
                up for the checks below, `stop` ends it.
  dashboard     every expression of every panel of the dashboard answers, with the run's labels
                (GPU panels: nothing, on a machine without NVML); every llmtrain_* series it
                names is exported; a panel outside the row "By rank" draws at most k ranks, and
                those of that row only the ranks of the variable rank.
  alerts        Prometheus evaluated every rule without error; every llmtrain_* series the rules
                name is exported; the run's injected NaN fired LlmtrainNonFiniteLoss (naming the
                action taken) and no other alert.
  alert-tests   every alert of RULES has a case of RULES_TEST that fires it and is silent in its
                healthy run; then promtool test rules RULES_TEST.
  counts        step histogram count = steps, tokens = steps x tokens per step, and every
                scraped loss equals log.jsonl's loss of the scraped step.
  lint          promtool check metrics accepts a scrape of /metrics.
  stop          ends the fixture's Prometheus.
  hostile       a 1 MB header line, garbage bytes, 200 concurrent connections for 10 s and
                slow-loris clients while training: step times stay within 20%, /metrics answers.
  port-in-use   a metrics port already taken: exit 2 and an error naming the port.
  nvml          a fake libnvidia-ml.so.1: the GPU series carry its values; without any: no
                GPU series and one log line.
  progress      on a terminal a live progress line with the ETA; in a file none.
"""
import json, os, random, re, signal, socket, subprocess, sys, threading, time, urllib.parse, urllib.request

TINY = ["--set", "model.n_layers=2", "--set", "model.d_model=64", "--set", "model.n_heads=2", "--set", "train.batch_size=4",
        "--set", "train.seq_len=64", "--set", "train.eval_sequences=8", "--set", "train.sample_tokens=0", "--set", "train.threads=1",
        "--set", "optimizer.warmup_steps=2", "--set", "train.log_every=1000"]
TOKENS_PER_STEP_PER_DP = 4 * 64


# What the fake NVML (tests/e2e/fake_nvml.c) reports, as the exporter must serve it: every
# llmtrain_gpu_* series there is.
FAKE_NVML_VALUES = {
    ("llmtrain_gpu_utilization_ratio", ()): 0.42, ("llmtrain_gpu_memory_utilization_ratio", ()): 0.17,
    ("llmtrain_gpu_memory_used_bytes", ()): 30e9, ("llmtrain_gpu_memory_total_bytes", ()): 80e9,
    ("llmtrain_gpu_power_watts", ()): 312.5, ("llmtrain_gpu_temperature_celsius", ()): 61,
    ("llmtrain_gpu_sm_clock_hertz", ()): 1.98e9, ("llmtrain_gpu_energy_joules_total", ()): 123456.789,
    ("llmtrain_gpu_throttle_active", (("reason", "sw_power_cap"),)): 1, ("llmtrain_gpu_throttle_active", (("reason", "gpu_idle"),)): 0,
    ("llmtrain_gpu_ecc_errors_total", (("type", "corrected"),)): 3, ("llmtrain_gpu_ecc_errors_total", (("type", "uncorrected"),)): 0,
    ("llmtrain_gpu_xid_errors_total", ()): 1, ("llmtrain_gpu_last_xid", ()): 79,
    ("llmtrain_gpu_nvlink_up", (("link", "0"),)): 1, ("llmtrain_gpu_nvlink_up", (("link", "1"),)): 0}
GPU_SERIES = {name for name, _ in FAKE_NVML_VALUES}


def fail(message):
    print("FAIL: " + message)
    sys.exit(1)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def wait_for(predicate, seconds, what):
    deadline = time.time() + seconds
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    fail("timed out waiting for " + what)


def read_targets(run_dir):
    try:
        with open(os.path.join(run_dir, "metrics_targets.json")) as f:
            return json.load(f)[0]["targets"]
    except (OSError, ValueError, IndexError):
        return None


def jsonl(run_dir, event):
    with open(os.path.join(run_dir, "log.jsonl")) as f:
        return [r for r in map(json.loads, f) if r["event"] == event]


def parse_exposition(text):
    """{(name, frozenset(labels)): value} of a text exposition."""
    series = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$', line)
        if not m:
            fail("unparsable exposition line: " + line)
        labels = frozenset(re.findall(r'([a-zA-Z_]+)="([^"]*)"', m.group(3) or ""))
        series[(m.group(1), labels)] = float(m.group(4))
    return series


def values(series, name, **labels):
    return [v for (n, l), v in series.items() if n == name and all((k, str(x)) in l for k, x in labels.items())]


def train_command(llmtrain, run_dir, steps, extra=()):
    return [llmtrain, "train", "configs/tiny.toml", *TINY, "--set", f"train.steps={steps}", "--run-dir", run_dir, *extra]


# ---- the fixture: Prometheus scraping a 2-rank run ----

def scraped_run(scratch, llmtrain, mpiexec, prometheus, rules_path):
    subprocess.run(["rm", "-rf", scratch])
    os.makedirs(scratch)
    run_dir = os.path.join(scratch, "run")
    prom_port = free_port()
    # The shipped rules, evaluated every second instead of every minute: the run lasts a minute.
    rules = os.path.join(scratch, "llmtrain-alerts.yml")
    with open(rules_path) as f, open(rules, "w") as out:
        text = f.read()
        if text.count("interval: 1m") != 2:
            fail(f"{rules_path}: two rule groups evaluated every minute (interval: 1m) expected")
        out.write(text.replace("interval: 1m", "interval: 1s"))
    config = os.path.join(scratch, "prometheus.yml")
    with open(config, "w") as f:
        f.write(f"""global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files: ['{rules}']
scrape_configs:
  - job_name: llmtrain
    honor_labels: true
    file_sd_configs:
      - files: ['{run_dir}/metrics_targets.json']
        refresh_interval: 1s
""")
    prom = subprocess.Popen([prometheus, f"--config.file={config}", f"--storage.tsdb.path={scratch}/tsdb", f"--web.listen-address=127.0.0.1:{prom_port}",
                             "--log.level=warn"], stdout=open(f"{scratch}/prometheus.log", "w"), stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{prom_port}"
    state = {"prometheus_pid": prom.pid, "prometheus": url, "run_dir": run_dir}
    with open(os.path.join(scratch, "state.json"), "w") as f:
        json.dump(state, f)

    def ready():
        try:
            return http_get(url + "/-/ready", 1) is not None
        except OSError:
            return False
    wait_for(ready, 60, "Prometheus to be ready")
    steps = 1500
    # Rank 0's gradients turn NaN at step 7 (skipped: an anomaly; without ZeRO-1 rank 0's own
    # gradients make the norm); checkpoints every 500 steps;
    # the last values stay served 4 s for the last scrapes.
    env = dict(os.environ, LLMTRAIN_INJECT_FAULT="nan:0:7")
    cmd = [mpiexec, "--oversubscribe", "-np", "2", *train_command(llmtrain, run_dir, steps, [
        "--set", "metrics.enabled=\"on\"", "--set", "metrics.port=0", "--set", "metrics.listen=\"127.0.0.1\"", "--set", "metrics.peak_tflops=0.05",
        "--set", "metrics.linger_seconds=4", "--set", "metrics.straggler_interval_steps=10", "--set", "monitor.on_nonfinite=\"skip\"", "--set", "parallel.zero_stage=0",
        # the spike detectors out of reach: the one anomaly counted is the injected NaN
        "--set", "monitor.loss_zscore=1000", "--set", "monitor.grad_zscore=1000",
        "--set", "train.eval_every=500", "--set", "checkpoint.every_steps=500", "--set", f"checkpoint.dir=\"{scratch}/checkpoints\""])]
    job = subprocess.Popen(cmd, env=env, stdout=open(f"{scratch}/run.out", "w"), stderr=subprocess.STDOUT)
    targets = wait_for(lambda: read_targets(run_dir), 120, "metrics_targets.json")
    # A scrape of rank 1 during the run, for promtool.
    wait_for(lambda: os.path.exists(os.path.join(run_dir, "log.jsonl")) and len(jsonl(run_dir, "step")) >= 20, 120, "20 steps")
    with open(os.path.join(scratch, "scrape.txt"), "w") as f:
        f.write(http_get(f"http://{targets[1]}/metrics"))
    # The run's last scrape: its values once the run has ended; and the alerts firing last.
    final, alerts = {}, []
    while job.poll() is None:
        try:
            final = {t: http_get(f"http://{t}/metrics", 1) for t in targets}
            alerts = json.loads(http_get(f"{url}/api/v1/alerts", 1))["data"]["alerts"]
        except OSError:
            pass
        time.sleep(0.2)
    if job.returncode != 0:
        fail(f"the run ended with {job.returncode}: " + open(f"{scratch}/run.out").read()[-2000:])
    state.update(steps=steps, ranks=2, targets=targets, job=os.path.basename(run_dir), end=time.time())
    with open(os.path.join(scratch, "state.json"), "w") as f:
        json.dump(state, f)
    with open(os.path.join(scratch, "final.json"), "w") as f:
        json.dump(final, f)
    with open(os.path.join(scratch, "alerts.json"), "w") as f:
        json.dump(alerts, f)
    print(f"ok: Prometheus at {url} scraped the 2-rank run at {', '.join(targets)}")


def load_state(scratch):
    with open(os.path.join(scratch, "state.json")) as f:
        return json.load(f)


def prom_query(state, expr, at):
    query = urllib.parse.urlencode({"query": expr, "time": f"{at:.3f}"})
    answer = json.loads(http_get(f"{state['prometheus']}/api/v1/query?{query}"))
    if answer["status"] != "success":
        fail(f"query {expr!r}: {answer}")
    return answer["data"]


# ---- the checks ----

def exported_series(scratch):
    """The names of the series the run's ranks served in their last scrape."""
    with open(os.path.join(scratch, "final.json")) as f:
        return {name for text in json.load(f).values() for name, _ in parse_exposition(text)}


def check_names_exported(what, expressions, exported):
    """Every llmtrain_* series the expressions name is one the run served, or a GPU series the
    fake NVML check proves served (a machine without NVML has none). Recorded series
    (job_kind:llmtrain_...:increase30m) are not the exporter's."""
    named = {n for e in expressions for n in re.findall(r"(?<![\w:])llmtrain_\w+", e)}
    unknown = sorted(n for n in named if n not in exported and n not in GPU_SERIES)
    if unknown:
        fail(f"{what} name series the exporter does not serve: {', '.join(unknown)}")
    return named


def dashboard_panels(board):
    """(row title, panel) of every panel, those inside collapsed rows included."""
    row = ""
    for panel in board["panels"]:
        if panel["type"] == "row":
            row = panel["title"]
            for inner in panel.get("panels", []):
                yield row, inner
        else:
            yield row, panel


def dashboard(scratch, dashboard_path):
    state = load_state(scratch)
    with open(dashboard_path) as f:
        board = json.load(f)
    variables = {v["name"]: v for v in board["templating"]["list"]}
    if not {"job", "host", "rank", "k"} <= set(variables):
        fail(f"dashboard variables {sorted(variables)}: job, host, rank and k wanted")
    if variables["k"]["current"].get("value") != "5" or not variables["rank"].get("multi"):
        fail(f"variable k defaults to {variables['k']['current']}, want 5; variable rank must be multi-select")
    # k = 1 and rank = 1: a job panel draws at most one rank of the two, a "By rank" panel rank 1 only.
    substitutions = {"$job": re.escape(state["job"]), "$host": ".*", "$rank": "1", "$k": "1", "$__rate_interval": "10s", "$__range": "1m",
                     "$__interval": "2s"}
    at = state["end"] - 2  # while the run still served its last values
    checked, expressions = 0, []
    for row, panel in dashboard_panels(board):
        by_rank = row.startswith("By rank")
        for target in panel.get("targets", []):
            expr = target["expr"]
            expressions.append(expr)
            where = f"panel {panel['title']!r}: {expr}"
            if by_rank != ('rank=~"$rank"' in expr) or (not by_rank and "$rank" in expr):
                fail(f"{where}: the variable rank belongs in every query of the row By rank and in no other")
            for variable, value in substitutions.items():
                expr = expr.replace(variable, value)
            result = prom_query(state, expr, at)["result"]
            if "llmtrain_gpu_" in expr or "llmtrain_moe_" in expr:
                # No NVML here, and the scraped run is a dense model: metrics.moe_series_answer
                # checks the mixture-of-experts panels on a MoE run.
                if result:
                    fail(f"{where} answers on a machine without NVML or for a dense model: {result[:1]}")
                checked += 1
                continue
            if not result:
                fail(f"{where} answers nothing")
            for series in result:
                if series["metric"].get("job") != state["job"]:
                    fail(f"{where}: a series without job=\"{state['job']}\": {series['metric']}")
                if "rank" in target.get("legendFormat", "") and "rank" not in series["metric"]:
                    fail(f"{where}: a series without rank: {series['metric']}")
            ranks = {s["metric"]["rank"] for s in result if "rank" in s["metric"]}
            if by_rank and ranks != {"1"}:
                fail(f"{where}: with rank = 1 it draws ranks {sorted(ranks)}")
            if not by_rank and len(ranks) > 1:
                fail(f"{where}: with k = 1 it draws {len(ranks)} ranks: a job panel shows aggregates and the worst k ranks")
            checked += 1
    named = check_names_exported("the dashboard's queries", [e for e in expressions if "llmtrain_moe_" not in e], exported_series(scratch))
    # The labels every raw series carries.
    for series in prom_query(state, f'llmtrain_loss{{job="{state["job"]}"}}', at)["result"]:
        if not {"job", "rank", "tp", "dp", "pp", "host"} <= set(series["metric"]):
            fail(f"llmtrain_loss lacks run labels: {series['metric']}")
    ranks = sorted(s["metric"]["rank"] for s in prom_query(state, f'llmtrain_step{{job="{state["job"]}"}}', at)["result"])
    if ranks != ["0", "1"]:
        fail(f"llmtrain_step of ranks {ranks}, want 0 and 1")
    print(f"ok: {checked} expressions of {sum(1 for _ in dashboard_panels(board))} panels answer with job=\"{state['job']}\" (GPU panels empty "
          f"without NVML), job panels draw at most k ranks, the row By rank only the chosen; the {len(named)} llmtrain_* series they name are served")


def alerts(scratch):
    state = load_state(scratch)
    groups = json.loads(http_get(f"{state['prometheus']}/api/v1/rules"))["data"]["groups"]
    rules = [r for g in groups for r in g["rules"]]
    if not rules:
        fail("Prometheus loaded no rules")
    broken = [f"{r['name']}: {r['health']} {r.get('lastError', '')}" for r in rules if r["health"] != "ok"]
    if broken:
        fail("rules that did not evaluate: " + "; ".join(broken))
    named = check_names_exported("the alert rules", [r["query"] for r in rules], exported_series(scratch))
    # The run's one anomaly, the NaN injected at step 7 and skipped, is the one alert.
    job = state["job"]
    firing = sorted(s["metric"]["alertname"] for s in prom_query(state, f'ALERTS{{alertstate="firing",job="{job}"}}', state["end"] - 2)["result"])
    if firing != ["LlmtrainNonFiniteLoss"]:
        fail(f"alerts firing at the run's end: {firing}, want LlmtrainNonFiniteLoss alone")
    with open(os.path.join(scratch, "alerts.json")) as f:
        last = [a for a in json.load(f) if a["labels"].get("job") == job and a["state"] == "firing"]
    description = " ".join(a["annotations"].get("description", "") for a in last)
    if f"{job} had a NaN or Inf loss" not in description or "actions since the ranks started: skip x1" not in description:
        fail(f"LlmtrainNonFiniteLoss's description does not name the run and the action: {last}")
    print(f"ok: {len(rules)} rules evaluated, the {len(named)} llmtrain_* series they name are served; the injected NaN fired "
          f"LlmtrainNonFiniteLoss alone: {description[:120]}...")


def alert_tests(rules_path, tests_path, promtool):
    import yaml  # python3-yaml
    with open(rules_path) as f:
        alert_names = [r["alert"] for g in yaml.safe_load(f)["groups"] for r in g["rules"] if "alert" in r]
    with open(tests_path) as f:
        suite = yaml.safe_load(f)
    rule_files = [os.path.realpath(os.path.join(os.path.dirname(tests_path), r)) for r in suite["rule_files"]]
    if rule_files != [os.path.realpath(rules_path)]:
        fail(f"{tests_path} tests {rule_files}, not {rules_path}")
    fired, healthy = set(), set()
    for test in suite["tests"]:
        for case in test.get("alert_rule_test", []):
            if case.get("exp_alerts"):
                fired.add(case["alertname"])
            elif test["name"] == "healthy run":
                healthy.add(case["alertname"])
    never_fired = [a for a in alert_names if a not in fired]
    never_silent = [a for a in alert_names if a not in healthy]
    if never_fired or never_silent:
        fail(f"{tests_path}: no case fires {never_fired}; the healthy run does not check {never_silent}")
    done = subprocess.run([promtool, "test", "rules", tests_path], capture_output=True, text=True)
    if done.returncode != 0:
        fail(f"promtool test rules: exit {done.returncode}\n{done.stdout}{done.stderr}")
    print(f"ok: promtool test rules: each of the {len(alert_names)} alerts fires from synthetic series and none in the healthy run")


def counts(scratch):
    state = load_state(scratch)
    steps, job = state["steps"], state["job"]
    with open(os.path.join(scratch, "final.json")) as f:
        final = json.load(f)
    if len(final) != 2:
        fail(f"the last scrapes reached {len(final)} ranks of 2")
    for target, text in final.items():
        s = parse_exposition(text)
        count = values(s, "llmtrain_step_duration_seconds_count")
        tokens = values(s, "llmtrain_tokens_total")
        want_tokens = steps * TOKENS_PER_STEP_PER_DP * 2
        if count != [steps]:
            fail(f"{target}: step histogram count {count}, want {steps}")
        if tokens != [want_tokens]:
            fail(f"{target}: tokens_total {tokens}, want {steps} x {TOKENS_PER_STEP_PER_DP * 2} = {want_tokens}")
        if values(s, "llmtrain_step") != [steps]:
            fail(f"{target}: llmtrain_step {values(s, 'llmtrain_step')}")
        if values(s, "llmtrain_anomalies_total", kind="nonfinite", action="skip") != [1] or values(s, "llmtrain_skipped_steps_total") != [1]:
            fail(f"{target}: the injected non-finite step is not counted once")
        if values(s, "llmtrain_checkpoint_saves_total") != [3]:
            fail(f"{target}: checkpoint saves {values(s, 'llmtrain_checkpoint_saves_total')}, want 3 (steps 500, 1000, 1500)")
        if values(s, "llmtrain_checkpoint_failures_total") != [0]:
            fail(f"{target}: failed checkpoint saves {values(s, 'llmtrain_checkpoint_failures_total')}, want 0")
    # Every loss Prometheus stored equals log.jsonl's loss of the step scraped with it.
    losses = {r["step"]: r["loss"] for r in jsonl(state["run_dir"], "step")}
    window = int(time.time() - state["end"]) + 600
    loss = prom_query(state, f'llmtrain_loss{{job="{job}",rank="0"}}[{window}s]', time.time())["result"][0]["values"]
    step = prom_query(state, f'llmtrain_step{{job="{job}",rank="0"}}[{window}s]', time.time())["result"][0]["values"]
    step_at = {t: int(float(v)) for t, v in step}
    pairs = [(step_at[t], float(v)) for t, v in loss if t in step_at and step_at[t] > 0]
    if len(pairs) < 3:
        fail(f"only {len(pairs)} scrapes of the loss during the run")
    for s, value in pairs:
        if abs(value - losses[s]) > 1e-12 * max(1.0, abs(losses[s])):
            fail(f"Prometheus' loss at step {s} is {value}, log.jsonl's {losses[s]}")
    print(f"ok: histogram count {steps} = steps, tokens {steps * TOKENS_PER_STEP_PER_DP * 2} = steps x tokens per step on both ranks; "
          f"{len(pairs)} scraped losses equal log.jsonl's")


def lint(scratch, promtool):
    scrape = os.path.join(scratch, "scrape.txt")
    with open(scrape) as f:
        result = subprocess.run([promtool, "check", "metrics"], stdin=f, capture_output=True, text=True)
    if result.returncode != 0 or result.stdout.strip() or result.stderr.strip():
        fail(f"promtool check metrics: exit {result.returncode}\n{result.stdout}{result.stderr}")
    print(f"ok: promtool check metrics accepts the scrape ({len(open(scrape).read().splitlines())} lines)")


def stop(scratch):
    state = load_state(scratch)
    try:
        os.killpg(state["prometheus_pid"], signal.SIGTERM)
    except ProcessLookupError:
        pass
    print("ok: Prometheus stopped")


# ---- the exporter under abuse ----

def single_run(scratch, llmtrain, steps, extra=(), env=None):
    run_dir = os.path.join(scratch, "run")
    out = open(os.path.join(scratch, "run.out"), "w")
    cmd = train_command(llmtrain, run_dir, steps, ["--set", "metrics.enabled=\"on\"", "--set", "metrics.listen=\"127.0.0.1\"", *extra])
    return run_dir, subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)


def step_seconds_between(run_dir, start, end):
    return sorted(r["step_ms"] for r in jsonl(run_dir, "step") if start <= parse_time(r["time"]) < end)


def parse_time(text):
    import calendar
    base, millis = text.rstrip("Z").split(".")
    return calendar.timegm(time.strptime(base, "%Y-%m-%dT%H:%M:%S")) + int(millis) / 1000


def median(xs):
    return xs[len(xs) // 2]


def attack(host, port, seconds):
    stop_at = time.time() + seconds
    errors = []

    def big_header():
        with socket.create_connection((host, port), 5) as s:
            try:
                s.sendall(b"GET /metrics HTTP/1.1\r\nX-Big: " + b"a" * (1 << 20) + b"\r\n\r\n")
                s.recv(4096)
            except OSError:
                pass  # the server may close on us: what matters is that it lives on

    junk = random.Random(1).randbytes(65536)  # made once: the client must not take the cores it measures

    def garbage():
        while time.time() < stop_at:
            with socket.create_connection((host, port), 5) as s:
                try:
                    s.sendall(junk)
                    s.recv(4096)
                except OSError:
                    pass
            time.sleep(0.5)

    def held_connection():
        with socket.create_connection((host, port), 30) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            time.sleep(max(0.0, stop_at - time.time()))

    def slowloris():
        with socket.create_connection((host, port), 30) as s:
            try:
                for byte in b"GET /metrics HTTP/1.1\r\nX-Slow: " + b"z" * 1000:
                    if time.time() >= stop_at:
                        break
                    s.send(bytes([byte]))
                    time.sleep(1)
            except OSError:
                pass  # dropped by the request timeout

    def guarded(fn):
        def run():
            try:
                fn()
            except OSError as e:
                errors.append(f"{fn.__name__}: {e}")
        return run
    threads = [threading.Thread(target=guarded(f)) for f in [big_header, garbage] + [held_connection] * 200 + [slowloris] * 8]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def hostile(scratch, llmtrain):
    subprocess.run(["rm", "-rf", scratch])
    os.makedirs(scratch)
    port = free_port()
    run_dir, job = single_run(scratch, llmtrain, 100000, ["--set", f"metrics.port={port}", "--set", "train.eval_every=0"])
    wait_for(lambda: os.path.exists(os.path.join(run_dir, "log.jsonl")) and len(jsonl(run_dir, "step")) >= 5, 120, "5 steps")
    time.sleep(5)
    t0 = time.time()
    time.sleep(8)
    t1 = time.time()
    errors = attack("127.0.0.1", port, 10)
    t2 = time.time()
    time.sleep(8)
    t3 = time.time()
    body = http_get(f"http://127.0.0.1:{port}/metrics", 15)
    job.send_signal(signal.SIGINT)
    job.wait(60)
    if job.returncode != 130:
        fail(f"the run ended with {job.returncode}, want 130 (stopped by SIGINT)")
    if "llmtrain_step_duration_seconds_count" not in body:
        fail("/metrics after the attack lacks the step histogram")
    before, during, after = (step_seconds_between(run_dir, a, b) for a, b in ((t0, t1), (t1, t2), (t2, t3)))
    if min(len(before), len(during), len(after)) < 5:
        fail(f"too few steps: {len(before)} before, {len(during)} during, {len(after)} after")
    # The slower of the quiet phases: the machine's own drift is not the attack's doing.
    quiet = max(median(before), median(after))
    ratio = median(during) / quiet
    print(f"median step {quiet:.1f} ms outside the attack, {median(during):.1f} ms during it (x{ratio:.3f}); client errors: {len(errors)}")
    if ratio > 1.2:
        fail(f"steps slowed by {100 * (ratio - 1):.0f}% under attack (allowed 20%)")
    print("ok: training went on at its pace under a 1 MB header, garbage, 200 held connections and 8 slow-loris clients; /metrics answers after")


def port_in_use(scratch, llmtrain):
    subprocess.run(["rm", "-rf", scratch])
    os.makedirs(scratch)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        run_dir, job = single_run(scratch, llmtrain, 3, ["--set", f"metrics.port={port}"])
        job.wait(120)
    out = open(os.path.join(scratch, "run.out")).read()
    want = f"llmtrain: config error: metrics.port: cannot serve /metrics on 127.0.0.1:{port} .*Address already in use"
    if job.returncode != 2 or not re.search(want, out):
        fail(f"exit {job.returncode} (want 2), output:\n{out}")
    if os.path.exists(run_dir):
        fail("a run refused for its port left a run directory")
    print(f"ok: port {port} in use: exit 2, '{out.strip().splitlines()[-1]}'")


def port_taken_auto(scratch, llmtrain, mpiexec):
    """Left at metrics.enabled = "auto", a 2-rank run whose ports are taken trains on, each rank
    serving on a free port (warned, and named in metrics_targets.json)."""
    subprocess.run(["rm", "-rf", scratch])
    os.makedirs(scratch)
    run_dir = os.path.join(scratch, "run")
    with socket.socket() as first, socket.socket() as second:
        first.bind(("127.0.0.1", 0))
        first.listen()
        port = first.getsockname()[1]
        try:
            second.bind(("127.0.0.1", port + 1))
            second.listen()
        except OSError:
            pass  # port + 1 is taken already: taken either way
        cmd = [mpiexec, "--oversubscribe", "-np", "2", *train_command(llmtrain, run_dir, 3, [
            "--set", f"metrics.port={port}", "--set", "metrics.listen=\"127.0.0.1\""])]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    out = done.stdout + done.stderr
    if done.returncode != 0 or len(re.findall(r"Address already in use; .*metrics.enabled = \"auto\": serving on the free port \d+ instead", out)) != 2:
        fail(f"exit {done.returncode} (want 0, and a warning from each rank), output:\n{out}")
    targets = read_targets(run_dir)
    if not targets or len(targets) != 2 or any(t.endswith(f":{port}") or t.endswith(f":{port + 1}") for t in targets):
        fail(f"metrics_targets.json names {targets}, not two free ports")
    print(f"ok: ports {port} and {port + 1} taken: the run trained, serving on {targets}")


def nvml(scratch, llmtrain, fake_dir):
    expected = FAKE_NVML_VALUES
    for with_fake in (True, False):
        sub = os.path.join(scratch, "fake" if with_fake else "none")
        subprocess.run(["rm", "-rf", sub])
        os.makedirs(sub)
        env = dict(os.environ)
        env.pop("LD_LIBRARY_PATH", None)
        if with_fake:
            env["LD_LIBRARY_PATH"] = fake_dir
        run_dir, job = single_run(sub, llmtrain, 4, ["--set", "metrics.port=0", "--set", "metrics.linger_seconds=3",
                                                     "--set", "metrics.gpu_interval_seconds=0.1"], env)
        targets = wait_for(lambda: read_targets(run_dir), 120, "metrics_targets.json")
        wait_for(lambda: len(jsonl(run_dir, "step")) >= 4, 120, "the run's steps")
        s = parse_exposition(http_get(f"http://{targets[0]}/metrics"))
        job.wait(60)
        out = open(os.path.join(sub, "run.out")).read()
        gpu_series = [n for (n, _) in s if n.startswith("llmtrain_gpu_")]
        if with_fake:
            for (name, labels), want in expected.items():
                got = values(s, name, gpu="0", **dict(labels))
                if len(got) != 1 or abs(got[0] - want) > 1e-9 * max(1, abs(want)):
                    fail(f"{name}{dict(labels)} = {got}, the fake NVML says {want}")
            if values(s, "llmtrain_gpu_nvlink_up", link="2"):
                fail("an NVLink link the fake does not have is exported")
            if "no GPU series" in out:
                fail("a 'no GPU series' line although NVML loaded")
        else:
            lines = [l for l in out.splitlines() if "no GPU series" in l]
            if gpu_series or len(lines) != 1 or "libnvidia-ml.so.1" not in lines[0]:
                fail(f"without NVML: GPU series {gpu_series[:3]}, log lines {lines}")
            print("without NVML: " + lines[0].strip())
    print(f"ok: {len(expected)} GPU series carry the fake NVML's values; without NVML the run trains and says why once")


# A mixture-of-experts run (8 experts, top-2, a capacity): every MoE series the dashboard
# queries is served by every rank, per layer, with the values of the run's log.jsonl, and
# the dashboard's MoE expressions name only served series.
def moe_series(scratch, llmtrain, dashboard_path):
    subprocess.run(["rm", "-rf", scratch])
    os.makedirs(scratch)
    steps = 6
    run_dir, job = single_run(scratch, llmtrain, steps, ["--set", "model.family=\"llama\"", "--set", "model.moe.n_experts=8", "--set", "model.moe.top_k=2",
                                                          "--set", "model.moe.capacity_factor=1.0", "--set", "metrics.port=0",
                                                          "--set", "metrics.linger_seconds=3"])
    targets = wait_for(lambda: read_targets(run_dir), 120, "metrics_targets.json")
    wait_for(lambda: len(jsonl(run_dir, "step")) >= steps, 120, "the run's steps")
    s = parse_exposition(http_get(f"http://{targets[0]}/metrics"))
    job.wait(60)
    if job.returncode != 0:
        fail(f"the MoE run ended with {job.returncode}: " + open(os.path.join(scratch, "run.out")).read()[-2000:])
    last = jsonl(run_dir, "step")[-1]["moe"]
    for name, key in (("llmtrain_moe_load_max_over_mean", "load_max_over_mean"), ("llmtrain_moe_dropped_fraction", "dropped_fraction")):
        for layer, want in zip(last["layers"], last[key]):
            got = values(s, name, layer=str(layer))
            if len(got) != 1 or abs(got[0] - want) > 1e-9 * max(1, abs(want)):
                fail(f"{name}{{layer=\"{layer}\"}} = {got}, log.jsonl's last step says {want}")
    got = values(s, "llmtrain_moe_balance_loss")
    if len(got) != 1 or abs(got[0] - last["balance_loss"]) > 1e-9 or got[0] <= 0:
        fail(f"llmtrain_moe_balance_loss = {got}, log.jsonl's last step says {last['balance_loss']}")
    with open(dashboard_path) as f:
        board = json.load(f)
    expressions = [t["expr"] for _, p in dashboard_panels(board) for t in p.get("targets", []) if "llmtrain_moe_" in t["expr"]]
    if not expressions:
        fail("the dashboard has no mixture-of-experts panel")
    check_names_exported("the dashboard's MoE queries", expressions, {n for (n, _) in s})
    print(f"ok: {len(expressions)} MoE expressions name served series; layers {last['layers']}: load {last['load_max_over_mean']}, "
          f"dropped {last['dropped_fraction']}, balancing loss {last['balance_loss']:.4g}, as log.jsonl says")


def progress(scratch, llmtrain):
    subprocess.run(["rm", "-rf", scratch])
    os.makedirs(scratch)
    run_dir = os.path.join(scratch, "tty")
    cmd = " ".join(f"'{a}'" for a in train_command(llmtrain, run_dir, 12))
    tty = subprocess.run(["script", "-qefc", cmd, "/dev/null"], capture_output=True, timeout=300)
    tty.stdout = tty.stdout.decode(errors="replace")  # bytes: text mode would turn each \r into \n
    live = re.findall(r"\r\x1b\[Kstep (\d+)/12 \| [0-9.]+[KMG]? tokens \| loss [0-9.]+ \| [0-9.]+[KMG]? tok/s \| ETA \d+[hms]", tty.stdout)
    if tty.returncode != 0 or not live or live[-1] != "12":
        fail(f"on a terminal: exit {tty.returncode}, progress lines {live}; output:\n{tty.stdout[-1500:]!r}")
    if "\x1b[K" in open(os.path.join(run_dir, "console.log")).read():
        fail("the progress line reached console.log")
    piped = subprocess.run(train_command(llmtrain, os.path.join(scratch, "file"), 12), capture_output=True, text=True, timeout=300)
    if piped.returncode != 0 or "ETA" in piped.stdout or "\r" in piped.stdout or len(re.findall(r"^step \d+/12 ", piped.stdout, re.M)) != 1:
        fail(f"into a file: exit {piped.returncode}, output:\n{piped.stdout}")
    print(f"ok: on a terminal {len(live)} redraws of the progress line, the last at step 12; into a file one step line per log_every")


if __name__ == "__main__":
    check, scratch, llmtrain, *rest = sys.argv[1:]
    scratch, llmtrain = os.path.abspath(scratch), os.path.abspath(llmtrain)
    checks = {"scraped-run": lambda: scraped_run(scratch, llmtrain, rest[0], rest[1], rest[2]), "dashboard": lambda: dashboard(scratch, rest[0]),
              "alerts": lambda: alerts(scratch), "alert-tests": lambda: alert_tests(rest[0], rest[1], rest[2]),
              "counts": lambda: counts(scratch), "lint": lambda: lint(scratch, rest[0]), "stop": lambda: stop(scratch),
              "hostile": lambda: hostile(scratch, llmtrain), "port-in-use": lambda: port_in_use(scratch, llmtrain),
              "port-taken-auto": lambda: port_taken_auto(scratch, llmtrain, rest[0]),
              "nvml": lambda: nvml(scratch, llmtrain, rest[0]), "progress": lambda: progress(scratch, llmtrain),
              "moe-series": lambda: moe_series(scratch, llmtrain, rest[0])}
    checks[check]()
