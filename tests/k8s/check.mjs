// Checks deploy/ offline (run by tests/test_deploy_configs.sh):
//   k8s         every manifest of deploy/k8s validates against the Kubernetes
//               API schemas (kubernetes-models), the kustomization lists every
//               file, and the pieces agree (probes, drain, GPU, volume,
//               Service, HPA and the Prometheus adapter's rules); the
//               container's args are flags `turbine serve --help` lists
//   dashboard   deploy/grafana/turbine.json is a dashboard whose every panel
//               query is PromQL that promtool parses
//   metrics     every metric named by a recording rule, an alert, a panel, a
//               template variable or the adapter's rules is one a live
//               `turbine serve` exports (histograms by _bucket/_sum/_count),
//               or a recording rule's name, or `up`
//   prometheus  every recording rule and alert has a promtool test; the
//               commented jobs of prometheus.yml pass promtool; Debian's
//               prometheus, run on prometheus.yml against the live server,
//               scrapes it and records the rules
//
// usage: node check.mjs SRC_DIR TURBINE_BIN ENGINE TMP_DIR
import { spawn, spawnSync } from "node:child_process";
import fs from "node:fs";
import http from "node:http";
import net from "node:net";
import path from "node:path";
import YAML from "yaml";
import { ConfigMap, PersistentVolumeClaim, Service } from "kubernetes-models/v1";
import { Deployment } from "kubernetes-models/apps/v1";
import { HorizontalPodAutoscaler } from "kubernetes-models/autoscaling/v2";

const [SRC, BIN, ENGINE, TMP] = process.argv.slice(2);
if (!TMP) {
  console.error("usage: node check.mjs SRC_DIR TURBINE_BIN ENGINE TMP_DIR");
  process.exit(2);
}
const DEPLOY = path.join(SRC, "deploy");
// killed (timeout, ctest): exit through the handlers that stop the server and Prometheus
for (const sig of ["SIGTERM", "SIGINT", "SIGHUP"]) process.on(sig, () => process.exit(128 + 15));
const PROMTOOL = process.env.PROMTOOL || "promtool";
let failures = 0;
const fail = (msg) => {
  console.log("FAIL: " + msg);
  failures++;
};
const ok = (msg) => console.log("ok: " + msg);
const check = (cond, msg) => {
  if (!cond) fail(msg);
  return !!cond;
};

// ---------------------------------------------------------------- Kubernetes
const MODELS = {
  "v1/ConfigMap": ConfigMap,
  "v1/PersistentVolumeClaim": PersistentVolumeClaim,
  "v1/Service": Service,
  "apps/v1/Deployment": Deployment,
  "autoscaling/v2/HorizontalPodAutoscaler": HorizontalPodAutoscaler,
};

function serveFlags() {
  const r = spawnSync(BIN, ["serve", "--help"], { encoding: "utf8" });
  check(r.status === 0, "turbine serve --help exited " + r.status);
  const flags = new Map(); // flag -> takes a value
  let inOptions = false;
  for (const line of r.stdout.split("\n")) {
    if (/^options:/.test(line)) inOptions = true;
    else if (inOptions && /^\s{2}-/.test(line)) {
      const head = line.trim().split(/\s{2,}/)[0]; // "--grace S", "--threads, -t N", "--no-prefix-caching, --x"
      const words = head.split(/,?\s+/);
      const takesValue = !words[words.length - 1].startsWith("-");
      for (const w of words) if (w.startsWith("--")) flags.set(w.replace(/,$/, ""), takesValue);
    }
  }
  check(flags.size > 10, "could not read the flags of turbine serve --help (" + flags.size + " found)");
  return flags;
}

function loadK8s() {
  const dir = path.join(DEPLOY, "k8s");
  const kust = YAML.parse(fs.readFileSync(path.join(dir, "kustomization.yaml"), "utf8"));
  check(kust.kind === "Kustomization", "kustomization.yaml: kind " + kust.kind);
  const listed = new Set(kust.resources || []);
  const present = fs.readdirSync(dir).filter((f) => /\.ya?ml$/.test(f) && f !== "kustomization.yaml");
  for (const f of present) check(listed.has(f), `deploy/k8s/${f} is not listed in kustomization.yaml's resources`);
  for (const f of listed) check(present.includes(f), `kustomization.yaml lists ${f}, which deploy/k8s lacks`);
  const objs = [];
  for (const f of present) {
    for (const doc of YAML.parseAllDocuments(fs.readFileSync(path.join(dir, f), "utf8"))) {
      if (doc.errors.length) {
        fail(`${f}: YAML error ${doc.errors[0].message}`);
        continue;
      }
      const o = doc.toJS();
      if (o == null) continue;
      const key = `${o.apiVersion}/${o.kind}`;
      const Model = MODELS[key];
      if (!check(Model, `${f}: no schema for ${key}`)) continue;
      try {
        new Model(o).validate();
        ok(`${f}: ${key} ${o.metadata?.name} validates against the Kubernetes schema`);
      } catch (e) {
        fail(`${f}: ${key} ${o.metadata?.name}: ${e.message}`);
      }
      objs.push({ file: f, key, o });
    }
  }
  return objs;
}

function checkK8s(objs, exported) {
  const one = (key) => {
    const l = objs.filter((x) => x.key === key);
    check(l.length === 1, `deploy/k8s holds ${l.length} ${key}, want 1`);
    return l[0]?.o;
  };
  const dep = one("apps/v1/Deployment");
  const svc = one("v1/Service");
  const hpa = one("autoscaling/v2/HorizontalPodAutoscaler");
  const pvc = one("v1/PersistentVolumeClaim");
  const cm = one("v1/ConfigMap");
  if (!dep || !svc || !hpa || !pvc || !cm) return;
  const pod = dep.spec.template.spec;
  const c = pod.containers[0];
  const labels = dep.spec.template.metadata.labels;
  for (const [k, v] of Object.entries(dep.spec.selector.matchLabels))
    check(labels[k] === v, `the Deployment's selector ${k}=${v} does not match its pod labels`);

  // args: `turbine serve ENGINE --flag value ...`, every flag one --help lists
  const args = [...(c.command || []), ...(c.args || [])];
  check(args[0] === "turbine" && args[1] === "serve", "the container does not run `turbine serve`: " + args.slice(0, 2));
  const flags = serveFlags();
  const opts = {};
  let engine = null;
  for (let i = 2; i < args.length; i++) {
    const a = String(args[i]);
    if (a.startsWith("--")) {
      if (!check(flags.has(a), `container arg ${a} is not a flag of turbine serve --help`)) continue;
      if (flags.get(a)) {
        const v = args[i + 1];
        check(v !== undefined && !String(v).startsWith("--"), `container arg ${a} lacks its value`);
        opts[a] = String(v);
        i++;
      } else opts[a] = true;
    } else if (engine === null) engine = a;
    else fail(`container arg ${a}: a second positional argument`);
  }
  check(opts["--host"] === "0.0.0.0" || opts["--host"] === "::", "the server must listen on every address in a pod");
  ok(`container args: ${Object.keys(opts).join(" ")} are turbine serve flags`);

  // the engine comes from a volume backed by the PVC
  const mount = (c.volumeMounts || []).find((m) => engine && engine.startsWith(m.mountPath.replace(/\/?$/, "/")));
  if (check(mount, `the engine ${engine} is not under a volume mount`)) {
    const vol = (pod.volumes || []).find((v) => v.name === mount.name);
    check(vol?.persistentVolumeClaim?.claimName === pvc.metadata.name,
      `the engine's volume ${mount.name} is not the PVC ${pvc.metadata.name}`);
    check(mount.readOnly === true, "the engine volume should be mounted read-only");
  }

  // probes on the container's named port: readiness /health (503 while loading
  // and draining), liveness /v2/health/live (200 while the process serves)
  const port = opts["--port"] ? Number(opts["--port"]) : 8000;
  const cport = (c.ports || []).find((p) => p.containerPort === port);
  check(cport, `no container port ${port} (--port)`);
  const probePort = (p) => (typeof p === "string" ? (c.ports || []).find((x) => x.name === p)?.containerPort : p);
  check(c.readinessProbe?.httpGet?.path === "/health", "readiness probe is not GET /health");
  check(c.livenessProbe?.httpGet?.path === "/v2/health/live", "liveness probe is not GET /v2/health/live");
  for (const pr of [c.readinessProbe, c.livenessProbe])
    check(probePort(pr?.httpGet?.port) === port, `a probe's port ${pr?.httpGet?.port} is not the server's ${port}`);

  // termination: preStop sleep + --grace + 5 s of stream flush fits the grace period
  const pre = c.lifecycle?.preStop;
  const preS = pre?.sleep ? pre.sleep.seconds : Number((pre?.exec?.command || []).join(" ").match(/sleep\s+(\d+)/)?.[1]);
  check(preS > 0, "no preStop sleep: the pod would stop listening before it leaves the endpoints");
  const grace = Number(opts["--grace"] ?? 30);
  const tg = pod.terminationGracePeriodSeconds ?? 30;
  check(tg >= preS + grace + 5, `terminationGracePeriodSeconds ${tg} < preStop ${preS} + --grace ${grace} + 5`);
  ok(`termination: preStop ${preS} s + --grace ${grace} s + 5 s flush <= ${tg} s`);

  // a GPU, requested and limited alike (extended resources must be equal)
  const rq = c.resources?.requests?.["nvidia.com/gpu"], lm = c.resources?.limits?.["nvidia.com/gpu"];
  check(rq !== undefined && String(rq) === String(lm), `nvidia.com/gpu request ${rq} and limit ${lm} must be set and equal`);
  check(/^cuda/.test(opts["--device"] || ""), "a GPU is requested but --device is not cuda");

  // the Service selects the pods and targets the server's port
  for (const [k, v] of Object.entries(svc.spec.selector || {}))
    check(labels[k] === v, `the Service's selector ${k}=${v} does not match the pods`);
  check(svc.spec.ports.every((p) => probePort(p.targetPort) === port), "a Service port does not target the server's port");

  // the HPA scales the Deployment on a metric the adapter publishes from one the server exports
  const ref = hpa.spec.scaleTargetRef;
  check(ref.kind === "Deployment" && ref.name === dep.metadata.name, "the HPA does not target the Deployment");
  const adapter = YAML.parse(cm.data["config.yaml"]);
  const published = new Map();
  for (const r of adapter.rules || []) {
    const series = (r.seriesQuery.match(/^[a-zA-Z_:][a-zA-Z0-9_:]*/) || [])[0];
    published.set(r.name?.as || series, series);
    for (const o of ["namespace", "pod"])
      check(r.resources?.overrides?.[o]?.resource === o, `adapter rule ${series}: label ${o} not mapped to the resource`);
  }
  for (const m of hpa.spec.metrics) {
    const name = m.pods?.metric?.name || m.object?.metric?.name || m.external?.metric?.name;
    if (!check(name, "an HPA metric that is not a Pods/Object/External metric")) continue;
    check(published.has(name), `the HPA's metric ${name} is not published by the adapter's rules`);
  }
  for (const [as, series] of published) exported.use(series, "prometheus-adapter rule " + as);
  ok(`HPA on ${hpa.spec.metrics.map((m) => m.pods?.metric?.name).join(", ")} through the adapter`);
}

// ------------------------------------------------------- PromQL metric names
const KEYWORDS = new Set(["and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
  "group_left", "group_right", "inf", "nan", "atan2"]);

function promqlMetrics(expr) {
  let e = expr.replace(/"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'/g, '""'); // strings
  e = e.replace(/\{[^}]*\}/g, " ").replace(/\[[^\]]*\]/g, " "); // matchers, ranges
  e = e.replace(/\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)/g, " ");
  const names = [];
  for (const m of e.matchAll(/(?<![a-zA-Z0-9_:.$])[a-zA-Z_:][a-zA-Z0-9_:]*/g)) {
    const call = /^\s*\(/.test(e.slice(m.index + m[0].length));
    if (call || KEYWORDS.has(m[0].toLowerCase())) continue; // a function call or a keyword
    names.push(m[0]);
  }
  return names;
}

// the extractor itself, on a query of every shape the files use
{
  const got = promqlMetrics('histogram_quantile(0.99, sum by (instance, le) (rate(a_bucket{x="y",m=~"$m"}[$__rate_interval])))' +
    ' / on (job) group_left max without (le) (b) > bool 2 and deriv(c:d:e[5m]) > 0 unless absent(up{job="t"} == 1)');
  if (got.join(",") !== "a_bucket,b,c:d:e,up") {
    console.log("FAIL: the PromQL name extractor found " + got.join(","));
    process.exit(1);
  }
}

// what a live server exports, and what the source says of metrics a CPU lacks
function exportedSet(text, recorded) {
  const types = new Map();
  const samples = new Set();
  for (const line of text.split("\n")) {
    let m;
    if ((m = line.match(/^# TYPE (\S+) (\S+)/))) types.set(m[1], m[2]);
    else if ((m = line.match(/^([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]/))) samples.add(m[1]);
  }
  const src = fs.readFileSync(path.join(SRC, "src/serve/metrics.c"), "utf8");
  // NVML's gauges: emitted only where NVML finds NVIDIA GPUs
  const nvmlAt = src.indexOf("nvml_gpus > 0");
  const nvmlBlock = nvmlAt < 0 ? "" : src.slice(nvmlAt, src.indexOf("\n    }\n", nvmlAt)); // the if's body
  const gpuOnly = new Set([...nvmlBlock.matchAll(/# TYPE (turbine_[a-z0-9_]+) gauge/g)].map((m) => m[1]));
  const used = new Map();
  return {
    types, gpuOnly, used,
    use(name, where) {
      if (!used.has(name)) used.set(name, new Set());
      used.get(name).add(where);
    },
    verify() {
      for (const [name, where] of used) {
        const at = [...where].slice(0, 2).join("; ");
        if (name.includes(":")) {
          check(recorded.has(name), `${name} (${at}) is neither exported nor a recording rule`);
          continue;
        }
        if (name === "up") continue; // Prometheus' own, per target
        const base = name.replace(/_(bucket|sum|count)$/, "");
        if (samples.has(name) && types.has(name)) continue;
        if (base !== name && types.get(base) === "histogram" && samples.has(name)) continue;
        if (gpuOnly.has(name) && !samples.has(name)) {
          console.log(`note: ${name} (${at}) is absent here (no NVIDIA GPU); src/serve/metrics.c emits it as a gauge with NVML`);
          continue;
        }
        fail(`${name} (${at}) is not a metric the server exports`);
      }
      console.log("metric names used: " + [...used.keys()].sort().join(" "));
      ok(`${used.size} metric names checked against the live server's /metrics (${samples.size} series names)`);
    },
  };
}

// ------------------------------------------------------------------ the server
function freePort() {
  return new Promise((res, rej) => {
    const s = net.createServer();
    s.on("error", rej);
    s.listen(0, "127.0.0.1", () => {
      const p = s.address().port;
      s.close(() => res(p));
    });
  });
}

// one HTTP request on its own connection (none left open to slow the drain)
function request(port, p, { method = "GET", headers = {}, body = null, timeout = 5000 } = {}) {
  return new Promise((res, rej) => {
    const req = http.request({ host: "127.0.0.1", port, path: p, method, headers, agent: false, timeout }, (r) => {
      let text = "";
      r.setEncoding("utf8");
      r.on("data", (d) => (text += d));
      r.on("end", () => res({ status: r.statusCode, text }));
    });
    req.on("timeout", () => req.destroy(new Error(`${method} ${p}: timed out`)));
    req.on("error", rej);
    req.end(body);
  });
}
const get = (port, p) => request(port, p);
const complete = (port, key, prompt, n) => request(port, "/v1/completions", {
  method: "POST", timeout: 20000,
  headers: { "content-type": "application/json", authorization: "Bearer " + key },
  body: JSON.stringify({ prompt, max_tokens: n, temperature: 0 }),
});

async function liveServer() {
  const port = await freePort();
  const log = fs.openSync(path.join(TMP, "deploy_serve.log"), "w");
  // with an API key, as the Deployment may set one: the probes and the scrape send none
  const key = "deploy-check-key";
  const proc = spawn(BIN, ["serve", ENGINE, "--host", "127.0.0.1", "--port", String(port), "--threads", "1",
    "--api-key", key],
    { stdio: ["ignore", log, log] });
  const stop = () => { try { proc.kill("SIGKILL"); } catch { /* gone */ } };
  process.on("exit", stop);
  const deadline = Date.now() + 30000;
  while (Date.now() < deadline && proc.exitCode === null) {
    try {
      if ((await get(port, "/health")).status === 200) break;
    } catch { /* not listening yet */ }
    await new Promise((r) => setTimeout(r, 50));
  }
  const health = await get(port, "/health").catch(() => ({ status: 0 }));
  if (health.status !== 200) {
    stop();
    throw new Error("turbine serve did not become ready:\n" + fs.readFileSync(path.join(TMP, "deploy_serve.log"), "utf8"));
  }
  // one request so that every series has been touched
  const done = await complete(port, key, "Once upon a time", 4);
  check(done.status === 200, "POST /v1/completions with the key -> " + done.status);
  const live = await get(port, "/v2/health/live");
  const metrics = await get(port, "/metrics");
  check(health.status === 200, "/health (the readiness probe) without the API key -> " + health.status);
  check(live.status === 200, "/v2/health/live (the liveness probe) without the API key -> " + live.status);
  check(metrics.status === 200, "/metrics without the API key -> " + metrics.status);
  check(/turbine_requests_finished_total\{[^}]*\} [1-9]/.test(metrics.text), "the request sent is not counted in /metrics");
  ok("the probes' routes and /metrics answer 200 without the API key");
  await livePrometheus(port, key);
  proc.kill("SIGTERM");
  const exited = await new Promise((res) => {
    const t = setTimeout(() => res(false), 15000);
    proc.on("exit", () => { clearTimeout(t); res(true); });
    if (proc.exitCode !== null) res(true);
  });
  check(exited, "turbine serve did not exit within 15 s of SIGTERM");
  return metrics.text;
}

// Debian's prometheus (the package promtool comes with) runs prometheus.yml
// and both rule files against the live replica, scraping every second: the
// target is up and the recording rules give values.
async function livePrometheus(port, key) {
  const bin = process.env.PROMETHEUS || "/usr/bin/prometheus";
  if (!fs.existsSync(bin)) {
    console.log(`note: ${bin} absent, the live scrape not tried`);
    return;
  }
  const dir = path.join(TMP, "prometheus");
  fs.rmSync(dir, { recursive: true, force: true });
  fs.mkdirSync(dir, { recursive: true });
  const cfg = YAML.parse(fs.readFileSync(path.join(DEPLOY, "prometheus", "prometheus.yml"), "utf8"));
  cfg.global.scrape_interval = cfg.global.evaluation_interval = "1s";
  cfg.rule_files = cfg.rule_files.map((f) => path.join(DEPLOY, "prometheus", f));
  const job = cfg.scrape_configs.find((j) => j.job_name === "turbine");
  if (!check(job, "prometheus.yml has no job turbine")) return;
  job.scrape_timeout = "1s";
  job.static_configs = [{ targets: [`127.0.0.1:${port}`] }];
  fs.writeFileSync(path.join(dir, "prometheus.yml"), YAML.stringify(cfg));
  const pport = await freePort();
  const log = fs.openSync(path.join(dir, "prometheus.log"), "w");
  const prom = spawn(bin, [`--config.file=${path.join(dir, "prometheus.yml")}`, `--storage.tsdb.path=${path.join(dir, "data")}`,
    `--web.listen-address=127.0.0.1:${pport}`], { stdio: ["ignore", log, log] });
  const stop = () => { try { prom.kill("SIGKILL"); } catch { /* gone */ } };
  process.on("exit", stop);
  const query = async (q) => {
    const r = await get(pport, "/api/v1/query?query=" + encodeURIComponent(q));
    return r.status === 200 ? JSON.parse(r.text).data.result : [];
  };
  const want = ["instance:turbine_requests:rate1m > 0", "job:turbine_time_to_first_token_seconds:p50_5m > 0",
    "job:turbine_e2e_request_latency_seconds:p99_5m > 0", "job:turbine_inter_token_latency_seconds:p95_5m > 0",
    "job:turbine_kv_cache_usage:max >= 0", "job:turbine_replicas_up:sum == 1"];
  const got = {};
  const deadline = Date.now() + 30000;
  while (Date.now() < deadline && prom.exitCode === null) {
    // a request now and then, so that the counters grow between scrapes
    await complete(port, key, "Lily", 8);
    for (const q of want) if (!got[q]) got[q] = (await query(q).catch(() => []))[0]?.value?.[1];
    if (want.every((q) => got[q] !== undefined)) break;
    await new Promise((r) => setTimeout(r, 250));
  }
  stop();
  const missing = want.filter((q) => got[q] === undefined);
  if (check(missing.length === 0, `a live Prometheus on prometheus.yml found no value for: ${missing.join("; ")}\n` +
    fs.readFileSync(path.join(dir, "prometheus.log"), "utf8").slice(-1500)))
    ok("a live Prometheus scraped the replica and recorded " + want.map((q) => `${q.split(" ")[0]} ${Number(got[q]).toPrecision(3)}`).join(", "));
}

// the commented variants of prometheus.yml (Kubernetes pod discovery, the
// nginx exporter), uncommented, pass promtool check config too
function commentedJobs() {
  const text = fs.readFileSync(path.join(DEPLOY, "prometheus", "prometheus.yml"), "utf8");
  const cfg = YAML.parse(text);
  const blocks = [];
  let cur = null;
  for (const line of text.split("\n")) {
    const m = line.match(/^ {2}# ?( {2}.*|- job_name:.*)$/);
    if (m && (cur || m[1].startsWith("- job_name:"))) {
      if (m[1].startsWith("- job_name:")) blocks.push((cur = []));
      cur.push("  " + m[1]);
    } else cur = null;
  }
  check(blocks.length >= 2, `prometheus.yml: ${blocks.length} commented jobs found, want the Kubernetes and nginx ones`);
  const promtoolJob = (job) => {
    const c = { ...cfg, rule_files: cfg.rule_files.map((f) => path.join(DEPLOY, "prometheus", f)),
      scrape_configs: [...cfg.scrape_configs.filter((j) => j.job_name !== job.job_name), job] };
    const f = path.join(TMP, `deploy_prometheus_${job.job_name}.yml`);
    fs.writeFileSync(f, YAML.stringify(c));
    const r = spawnSync(PROMTOOL, ["check", "config", f], { encoding: "utf8" });
    return { status: r.status, out: r.stdout + r.stderr };
  };
  for (const b of blocks) {
    const job = YAML.parse(b.join("\n"))[0];
    const what = Object.keys(job).filter((k) => k.endsWith("_configs")).join(", ");
    let r = promtoolJob(job);
    if (r.status !== 0 && /field kubernetes_sd_configs not found/.test(r.out)) {
      // Debian builds Prometheus without Kubernetes discovery: check the rest
      // of the job (its relabelling) with the discovery swapped for a static target
      console.log(`note: this promtool lacks kubernetes_sd_configs (Debian's build); job ${job.job_name} checked with a static target in its place`);
      const { kubernetes_sd_configs: sd, ...rest } = job;
      check(sd?.[0]?.role === "pod", `job ${job.job_name}: kubernetes_sd_configs role ${sd?.[0]?.role}, want pod`);
      r = promtoolJob({ ...rest, static_configs: [{ targets: ["127.0.0.1:8000"] }] });
    }
    if (check(r.status === 0, `the commented job ${job.job_name} of prometheus.yml fails promtool:\n${r.out}`))
      ok(`prometheus.yml's commented job ${job.job_name} (${what}) passes promtool check config`);
  }
}

// ------------------------------------------------------------------- the rest
function promtoolParses(exprs, what) {
  // a rules file with each expression as a recording rule: promtool parses them
  const f = path.join(TMP, `deploy_${what}_exprs.yml`);
  const rules = exprs.map((e, i) => ({ record: `check:${what}:${i}`, expr: e }));
  fs.writeFileSync(f, YAML.stringify({ groups: [{ name: what, rules }] }));
  const r = spawnSync(PROMTOOL, ["check", "rules", f], { encoding: "utf8" });
  check(r.status === 0, `promtool cannot parse the ${what} queries:\n${r.stdout}${r.stderr}`);
  if (r.status === 0) ok(`promtool parses the ${exprs.length} ${what} queries`);
}

async function main() {
  // rules
  const recorded = new Set();
  const ruleExprs = [];
  for (const f of ["recording_rules.yml", "alert_rules.yml"]) {
    const doc = YAML.parse(fs.readFileSync(path.join(DEPLOY, "prometheus", f), "utf8"));
    for (const g of doc.groups)
      for (const r of g.rules) {
        if (r.record) recorded.add(r.record);
        ruleExprs.push({ expr: r.expr, where: `${f} ${r.record || r.alert}` });
      }
  }
  // every recording rule has a value test, every alert a firing test
  const tested = new Set(), fired = new Set();
  const alerts = ruleExprs.filter((r) => r.where.startsWith("alert_rules.yml")).map((r) => r.where.split(" ")[1]);
  for (const f of fs.readdirSync(path.join(DEPLOY, "prometheus", "tests"))) {
    const t = YAML.parse(fs.readFileSync(path.join(DEPLOY, "prometheus", "tests", f), "utf8"));
    for (const c of t.tests || []) {
      for (const e of c.promql_expr_test || []) if ((e.exp_samples || []).length) tested.add(e.expr.trim());
      for (const a of c.alert_rule_test || []) if ((a.exp_alerts || []).length) fired.add(a.alertname);
    }
  }
  const untested = [...recorded].filter((r) => !tested.has(r));
  const unfired = alerts.filter((a) => !fired.has(a));
  check(untested.length === 0, "recording rules without a value in deploy/prometheus/tests: " + untested.join(", "));
  check(unfired.length === 0, "alerts never firing in deploy/prometheus/tests: " + unfired.join(", "));
  ok(`deploy/prometheus/tests: all ${recorded.size} recording rules valued, all ${alerts.length} alerts fired`);

  commentedJobs();
  const metricsText = await liveServer();
  const exported = exportedSet(metricsText, recorded);
  for (const { expr, where } of ruleExprs) for (const n of promqlMetrics(expr)) exported.use(n, where);

  // dashboard
  let dash = null;
  try {
    dash = JSON.parse(fs.readFileSync(path.join(DEPLOY, "grafana", "turbine.json"), "utf8"));
  } catch (e) {
    fail("deploy/grafana/turbine.json is not valid JSON: " + e.message);
  }
  if (dash) {
    check(dash.uid && dash.title && Array.isArray(dash.panels), "the dashboard lacks uid, title or panels");
    const ids = new Set();
    const exprs = [];
    const titles = [];
    for (const p of dash.panels) {
      check(!ids.has(p.id), `panel id ${p.id} repeats`);
      ids.add(p.id);
      const g = p.gridPos || {};
      check(g.w > 0 && g.h > 0 && g.x >= 0 && g.x + g.w <= 24, `panel ${p.title}: bad gridPos`);
      if (p.type === "row") continue;
      titles.push(p.title);
      check((p.targets || []).length > 0, `panel ${p.title} has no query`);
      for (const t of p.targets || []) {
        check(typeof t.expr === "string" && t.expr.length, `panel ${p.title}: a target without expr`);
        exprs.push(t.expr);
        for (const n of promqlMetrics(t.expr)) exported.use(n, "panel " + p.title);
      }
    }
    for (const v of dash.templating?.list || []) {
      const q = typeof v.query === "string" ? v.query : v.query?.query;
      const m = v.type === "query" && q?.match(/label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)/);
      if (m) exported.use(m[1], "variable " + v.name);
    }
    for (const want of [/QPS/, /TTFT/, /TPOT/, /E2E/, /KV-cache usage/, /Waiting/, /GPU utilisation/, /GPU memory/])
      check(titles.some((t) => want.test(t)), `no dashboard panel titled ${want}`);
    // Grafana's variables, as Grafana substitutes them
    promtoolParses(exprs.map((e) => e.replace(/\$__rate_interval/g, "1m").replace(/\$\{?\w+\}?/g, ".*")), "dashboard");
    ok(`dashboard: ${titles.length} panels, ${exprs.length} queries`);
  }

  // Kubernetes
  const objs = loadK8s();
  checkK8s(objs, exported);
  exported.verify();
  if (failures) {
    console.log(`${failures} check(s) failed`);
    process.exit(1);
  }
}

main().catch((e) => {
  console.log("FAIL: " + (e.stack || e));
  process.exit(1);
});
