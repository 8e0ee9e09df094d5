// Renders every kustomize overlay and validates what comes out, offline:
//   1. schema: each object against the Kubernetes 1.27 OpenAPI schemas of kubernetes-models (and
//      the Prometheus Operator CRDs' schemas of @kubernetes-models/prometheus-operator);
//   2. strict keys: no field the schema does not know (the schema validators accept unknown
//      fields, so a typo such as `livenessprobe` would pass them): every key is looked up in the
//      models' type declarations (.d.ts), walking nested types;
//   3. consistency: what the cluster would only tell at run time (probes on declared ports,
//      selectors that select, budgets that fit the memory limits, grace periods that cover the
//      drain, config maps that exist, one GPU per GPU worker, ...).
// Usage: node validate_manifests.mjs <kubectl> <overlay dir>...   Exit 1 on any finding.
//        node validate_manifests.mjs --expect <file> <kubectl> <overlay dir>...
//   Exit 0 only when the findings are exactly those the file lists (one substring a line):
//   how tests/deploy/broken-overlay shows that each check can fail.
import { execFileSync } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { parseAllDocuments } from "yaml";

const here = dirname(fileURLToPath(import.meta.url));
const modules = join(here, "node_modules");
const failures = [];
const fail = (where, what) => failures.push(`${where}: ${what}`);

// --- 1. schema -------------------------------------------------------------------------------

// apiVersion -> the models module and the folder of its .d.ts files.
function modelPath(apiVersion) {
  if (apiVersion.startsWith("monitoring.coreos.com/")) {
    return `@kubernetes-models/prometheus-operator/${apiVersion}`;
  }
  return `kubernetes-models/${apiVersion}`;  // "v1" is core, "apps/v1" etc. the groups
}

async function validateSchema(obj, where) {
  let mod;
  try {
    mod = await import(modelPath(obj.apiVersion));
  } catch (e) {
    return fail(where, `no schema for apiVersion ${obj.apiVersion}`);
  }
  const Model = mod[obj.kind];
  if (!Model) return fail(where, `no schema for kind ${obj.kind} in ${obj.apiVersion}`);
  try {
    new Model(obj).validate();
  } catch (e) {
    fail(where, `schema: ${e.message}`);
  }
}

// --- 2. strict keys --------------------------------------------------------------------------

const declCache = new Map();

// The properties of the model class declared in a .d.ts file: name -> {type, imports}; null when
// the file declares no class (type aliases such as IntOrString or Duration: free-form values).
function classDecl(file) {
  if (declCache.has(file)) return declCache.get(file);
  let result = null;
  if (existsSync(file)) {
    const text = readFileSync(file, "utf8").replace(/\/\*\*[\s\S]*?\*\//g, "");
    const imports = new Map();
    for (const m of text.matchAll(/import \{([^}]*)\} from "([^"]+)"/g)) {
      for (const name of m[1].split(",").map((s) => s.trim()).filter(Boolean)) {
        imports.set(name, m[2]);
      }
    }
    const start = text.search(/export declare class \w+[^{]*\{/);
    if (start >= 0) {
      const open = text.indexOf("{", start);
      const props = new Map();
      let depth = 0, i = open, line = "";
      // Properties are the class body's depth-1 statements: `"name"?: Type;` (Type may be a
      // multi-line `{ ... }` map).
      for (; i < text.length; i++) {
        const c = text[i];
        if (c === "{") depth++;
        if (c === "}") depth--;
        if (depth === 0) break;
        if (i > open) line += c;
        if ((c === ";" || c === "\n") && depth === 1) {
          const m = line.trim().match(/^"([^"]+)"\??:\s*([\s\S]*?);?$/);
          if (m) props.set(m[1], m[2].trim());
          line = "";
        }
      }
      result = { props, imports, dir: dirname(file) };
    }
  }
  declCache.set(file, result);
  return result;
}

function importedFile(spec, fromDir) {
  if (spec.startsWith(".")) return resolve(fromDir, spec.replace(/\.js$/, ".d.ts"));
  return join(modules, `${spec.replace(/\.js$/, "")}.d.ts`);
}

function checkKeys(value, file, path, where) {
  if (value === null || typeof value !== "object" || Array.isArray(value)) return;
  const decl = classDecl(file);
  if (!decl) return;
  for (const [key, child] of Object.entries(value)) {
    if (!decl.props.has(key)) {
      fail(where, `unknown field ${path}.${key}`);
      continue;
    }
    let type = decl.props.get(key);
    const array = type.match(/^Array<(\w+)>$/);
    if (array) type = array[1];
    if (!/^\w+$/.test(type) || !decl.imports.has(type)) continue;  // primitive, map, literal
    const next = importedFile(decl.imports.get(type), decl.dir);
    const items = array && Array.isArray(child) ? child : [child];
    items.forEach((item, n) => checkKeys(item, next, array ? `${path}.${key}[${n}]` : `${path}.${key}`, where));
  }
}

function checkStrictKeys(obj, where) {
  const file = join(modules, modelPath(obj.apiVersion), `${obj.kind}.d.ts`);
  if (!existsSync(file)) return fail(where, `no type declarations at ${file}`);
  checkKeys(obj, file, "", where);
}

// --- 3. consistency --------------------------------------------------------------------------

const BYTE_UNITS = { "": 1, K: 1e3, M: 1e6, G: 1e9, T: 1e12, Ki: 2 ** 10, Mi: 2 ** 20, Gi: 2 ** 30, Ti: 2 ** 40 };
// "96Gi" (Kubernetes) or "96GiB" (our flags) -> bytes.
function parseBytes(text) {
  const m = String(text).match(/^(\d+(?:\.\d+)?)\s*(K|M|G|T|Ki|Mi|Gi|Ti)?B?$/);
  if (!m) throw new Error(`not a byte size: ${text}`);
  return Number(m[1]) * BYTE_UNITS[m[2] ?? ""];
}

function podTemplates(objects) {
  return objects
    .filter((o) => ["Deployment", "StatefulSet"].includes(o.kind))
    .map((o) => ({ owner: o, pod: o.spec.template }));
}

const selects = (selector, labels) =>
  Object.entries(selector ?? {}).every(([k, v]) => labels?.[k] === v);

// The value a container sees for $(VAR): literal env, a key of a rendered ConfigMap, or the
// pod's name or namespace (the downward-API fields the manifests use).
function envValue(container, name, objects) {
  const env = (container.env ?? []).find((e) => e.name === name);
  if (!env) return undefined;
  if (env.value !== undefined) return env.value;
  const field = env.valueFrom?.fieldRef?.fieldPath;
  if (field === "metadata.namespace" || field === "metadata.name") return `<${field}>`;
  const ref = env.valueFrom?.configMapKeyRef;
  if (!ref) return undefined;
  return objects.find((o) => o.kind === "ConfigMap" && o.metadata.name === ref.name)?.data?.[ref.key];
}

// The data of the rendered moe-budgets ConfigMap (its generated name has a hash suffix).
const budgets = (objects) =>
  objects.find((o) => o.kind === "ConfigMap" && o.metadata.name.startsWith("moe-budgets"))?.data ?? {};

function flag(container, name) {
  const prefix = `--${name}=`;
  return (container.args ?? []).find((a) => a.startsWith(prefix))?.slice(prefix.length);
}

function expand(text, container, objects) {
  return text?.replace(/\$\(([A-Z0-9_]+)\)/g, (_, v) => envValue(container, v, objects) ?? `$(${v})`);
}

function checkConsistency(objects, overlay) {
  const where = (o, extra = "") => `${overlay} ${o.kind}/${o.metadata.name}${extra}`;
  const templates = podTemplates(objects);

  for (const { owner, pod } of templates) {
    const spec = pod.spec;
    const allContainers = [...(spec.initContainers ?? []), ...spec.containers];
    const ports = new Map();
    for (const c of spec.containers) {
      for (const p of c.ports ?? []) {
        if (ports.has(p.name)) fail(where(owner), `port name ${p.name} used twice in the pod`);
        ports.set(p.name, p.containerPort);
      }
    }
    if (!selects(owner.spec.selector.matchLabels, pod.metadata.labels)) {
      fail(where(owner), "selector does not select its own pod template");
    }
    for (const c of allContainers) {
      const w = where(owner, ` container ${c.name}`);
      // Every $(VAR) in args resolves (a typo'd name is passed through literally by the kubelet).
      for (const a of c.args ?? []) {
        for (const m of a.matchAll(/\$\(([A-Z0-9_]+)\)/g)) {
          const v = envValue(c, m[1], objects);
          if (v === undefined) fail(w, `arg ${a}: $(${m[1]}) has no env value (ConfigMap key missing?)`);
        }
      }
      for (const e of c.env ?? []) {
        const ref = e.valueFrom?.configMapKeyRef;
        if (ref && envValue(c, e.name, objects) === undefined) {
          fail(w, `env ${e.name}: ConfigMap ${ref.name} has no key ${ref.key}`);
        }
      }
      for (const m of c.volumeMounts ?? []) {
        const known = (spec.volumes ?? []).some((v) => v.name === m.name) ||
          (owner.spec.volumeClaimTemplates ?? []).some((t) => t.metadata.name === m.name);
        if (!known) fail(w, `volumeMount ${m.name} names no volume or claim template`);
      }
    }
    for (const c of spec.containers) {
      const w = where(owner, ` container ${c.name}`);
      const own = new Set((c.ports ?? []).map((p) => p.containerPort));
      for (const kind of ["startupProbe", "readinessProbe", "livenessProbe"]) {
        const probe = c[kind];
        if (!probe) { fail(w, `no ${kind}`); continue; }
        if (!probe.grpc) { fail(w, `${kind} is not a gRPC probe`); continue; }
        if (!own.has(probe.grpc.port)) fail(w, `${kind} probes port ${probe.grpc.port}, not one of its ports`);
        const listen = flag(c, "listen");
        if (listen && !listen.endsWith(`:${probe.grpc.port}`)) {
          fail(w, `${kind} probes port ${probe.grpc.port} but --listen=${listen}`);
        }
      }
      const metrics = flag(c, "metrics_listen");
      if (metrics && ![...own].some((p) => metrics.endsWith(`:${p}`))) {
        fail(w, `--metrics_listen=${metrics} is not a declared container port`);
      }
      // Graceful termination: the kubelet waits terminationGracePeriodSeconds after preStop
      // starts; it must cover preStop + the drain the process does on SIGTERM.
      const drain = Number(flag(c, "drain_seconds") ?? 0);
      const preStop = Number(c.lifecycle?.preStop?.exec?.command?.[0] === "sleep" ? c.lifecycle.preStop.exec.command[1] : 0);
      const grace = spec.terminationGracePeriodSeconds ?? 30;
      if (grace < drain + preStop + 5) {
        fail(w, `terminationGracePeriodSeconds ${grace} < preStop ${preStop} + drain ${drain} + 5 s`);
      }
      // Liveness must not kill a draining process (health is NOT_SERVING during the drain).
      const live = c.livenessProbe;
      if (live && (live.periodSeconds ?? 10) * (live.failureThreshold ?? 3) <= drain) {
        fail(w, `livenessProbe gives up after ${(live.periodSeconds ?? 10) * (live.failureThreshold ?? 3)} s, within the ${drain} s drain`);
      }
    }

    const worker = spec.containers.find((c) => c.command?.[0] === "moe-worker");
    if (worker) {
      const w = where(owner, " container worker");
      const backend = flag(worker, "backend");
      const gpus = worker.resources?.limits?.["nvidia.com/gpu"];
      if (backend === "cuda" && String(gpus) !== "1") fail(w, `--backend=cuda needs nvidia.com/gpu limit 1, has ${gpus}`);
      if (backend === "cpu" && gpus !== undefined) fail(w, "--backend=cpu but requests a GPU");
      if (backend === "cuda" && String(worker.resources?.requests?.["nvidia.com/gpu"] ?? gpus) !== "1") {
        fail(w, "nvidia.com/gpu request must equal the limit (1)");
      }
      // Memory: the host tier is RAM on either backend; on the CPU backend the device tier and
      // the KV cache are RAM too. The limit must hold them plus 1 GiB for the process itself.
      // A budget is the worker's flag, or (store tiers the worker has no flag for yet) the
      // moe-budgets ConfigMap's MOE_<NAME> key.
      const config = budgets(objects);
      const budget = (n) => parseBytes(expand(flag(worker, n), worker, objects) ?? config[`MOE_${n.toUpperCase()}`] ?? "0");
      let ram = budget("host_budget");
      if (backend === "cpu") ram += budget("device_budget") + budget("kv_budget");
      const limit = worker.resources?.limits?.memory;
      if (!limit) fail(w, "no memory limit");
      else if (parseBytes(limit) < ram + 2 ** 30) {
        fail(w, `memory limit ${limit} does not hold the budgets (${(ram / 2 ** 30).toFixed(1)} GiB) + 1 GiB`);
      }
      if (worker.resources?.requests?.memory !== limit) fail(w, "memory request != limit (pinned memory must not be overcommitted)");
      if (backend === "cuda") {
        // One H100 has 80 GB; the device tier and the KV cache share it with activations.
        const vram = budget("device_budget") + budget("kv_budget");
        if (vram > 76 * 2 ** 30) fail(w, `device + KV budgets ${(vram / 2 ** 30).toFixed(1)} GiB exceed an 80 GiB GPU`);
      }
      for (const t of owner.spec.volumeClaimTemplates ?? []) {
        if (t.spec.storageClassName !== "local-nvme") fail(w, `claim ${t.metadata.name} is not on storageClassName local-nvme`);
      }
    }
  }

  for (const svc of objects.filter((o) => o.kind === "Service")) {
    const pods = templates.filter(({ pod }) => selects(svc.spec.selector, pod.metadata.labels));
    if (pods.length === 0) { fail(where(svc), "selects no pod template"); continue; }
    for (const p of svc.spec.ports) {
      for (const { pod } of pods) {
        const declared = pod.spec.containers.flatMap((c) => c.ports ?? []);
        const ok = typeof p.targetPort === "number"
          ? declared.some((d) => d.containerPort === p.targetPort)
          : declared.some((d) => d.name === p.targetPort);
        if (!ok) fail(where(svc), `targetPort ${p.targetPort} is no container port of the pods it selects`);
      }
    }
  }
  for (const sts of objects.filter((o) => o.kind === "StatefulSet")) {
    const svc = objects.find((o) => o.kind === "Service" && o.metadata.name === sts.spec.serviceName);
    if (!svc || svc.spec.clusterIP !== "None") fail(where(sts), `serviceName ${sts.spec.serviceName} is not a headless Service`);
  }
  // The frontend resolves the workers' headless Service by DNS, and is ready while a worker
  // serves the ConfigMap's model (a probe naming another model keeps every frontend unready).
  for (const { owner, pod } of templates) {
    for (const c of pod.spec.containers.filter((c) => c.command?.[0] === "moe-frontend")) {
      const service = c.readinessProbe?.grpc?.service;
      const model = `model/${budgets(objects).MOE_MODEL_NAME}`;
      if (service !== undefined && service !== model) {
        fail(where(owner, ` container ${c.name}`), `readinessProbe asks for service "${service}", not "${model}" (MOE_MODEL_NAME)`);
      }
      const dns = flag(c, "workers_dns");
      const target = dns ?? flag(c, "workers") ?? "";
      const m = dns?.match(/^([^.:]+)\.[^:]+:(\d+)$/);
      if (dns !== undefined && !m) {
        fail(where(owner), `--workers_dns=${dns} is not <headless service>.<namespace>.svc...:<port>`);
      } else if (m) {
        const svc = objects.find((o) => o.kind === "Service" && o.metadata.name === m[1]);
        if (!svc || svc.spec.clusterIP !== "None") fail(where(owner), `--workers_dns names ${m[1]}, not a headless Service`);
        else if (!svc.spec.ports.some((p) => p.port === Number(m[2]))) fail(where(owner), `--workers_dns port ${m[2]} is not a port of Service ${m[1]}`);
      } else if (!/^(\d+\.\d+\.\d+\.\d+:\d+)(,\d+\.\d+\.\d+\.\d+:\d+)*$/.test(target)) {
        fail(where(owner), `--workers=${target} is not a host:port list`);
      }
    }
  }
  for (const pdb of objects.filter((o) => o.kind === "PodDisruptionBudget")) {
    if (!templates.some(({ pod }) => selects(pdb.spec.selector.matchLabels, pod.metadata.labels))) {
      fail(where(pdb), "selects no pod template");
    }
  }
  for (const hpa of objects.filter((o) => o.kind === "HorizontalPodAutoscaler")) {
    const ref = hpa.spec.scaleTargetRef;
    if (!objects.some((o) => o.kind === ref.kind && o.metadata.name === ref.name)) {
      fail(where(hpa), `scaleTargetRef ${ref.kind}/${ref.name} is not in the overlay`);
    }
    if (!hpa.spec.metrics?.some((m) => m.type === "Pods" && m.pods.metric.name.startsWith("moe_"))) {
      fail(where(hpa), "no Pods metric on a moe_ queue metric");
    }
  }
  // NetworkPolicies: every pod is selected by one that restricts ingress; a port named
  // *metrics is open to Prometheus only, and the worker API (a worker's port grpc) to the
  // frontend only (the frontend's token protects nothing if anything else can call the workers).
  const policies = objects.filter((o) => o.kind === "NetworkPolicy" &&
    (o.spec.policyTypes ?? ["Ingress"]).includes("Ingress"));
  for (const { owner, pod } of templates) {
    const mine = policies.filter((p) => selects(p.spec.podSelector?.matchLabels, pod.metadata.labels));
    if (mine.length === 0) {
      fail(where(owner), "no NetworkPolicy selects its pods");
      continue;
    }
    const isWorker = pod.metadata.labels?.["app.kubernetes.io/component"] === "worker";
    for (const port of pod.spec.containers.flatMap((c) => c.ports ?? [])) {
      const rules = mine.flatMap((p) => p.spec.ingress ?? []).filter((r) =>
        !r.ports || r.ports.some((rp) => rp.port === port.name || rp.port === port.containerPort));
      const peers = rules.flatMap((r) => r.from ?? [{}]);  // a rule without from: anyone
      const onlyFrom = (name) =>
        peers.every((peer) => peer.podSelector?.matchLabels?.["app.kubernetes.io/name"] === name && !peer.ipBlock);
      if (port.name.endsWith("metrics") && !onlyFrom("prometheus")) {
        fail(where(owner), `port ${port.name} is open to more than Prometheus`);
      }
      if (isWorker && port.name === "grpc" && !onlyFrom("moe-frontend")) {
        fail(where(owner), `port grpc is open to more than the frontend`);
      }
    }
  }

  for (const mon of objects.filter((o) => ["PodMonitor", "ServiceMonitor"].includes(o.kind))) {
    const endpoints = mon.spec.podMetricsEndpoints ?? mon.spec.endpoints;
    const targets = mon.kind === "PodMonitor"
      ? templates.filter(({ pod }) => selects(mon.spec.selector.matchLabels, pod.metadata.labels)).map(({ pod }) => pod.spec.containers.flatMap((c) => c.ports ?? []))
      : objects.filter((o) => o.kind === "Service" && selects(mon.spec.selector.matchLabels, o.metadata.labels)).map((s) => s.spec.ports);
    if (targets.length === 0) fail(where(mon), "selects nothing");
    for (const ports of targets) {
      for (const e of endpoints) {
        if (!ports.some((p) => p.name === e.port)) fail(where(mon), `port ${e.port} is not a named port of what it selects`);
      }
    }
  }
}

// --- main ------------------------------------------------------------------------------------

let argv = process.argv.slice(2);
let expectFile = null;
if (argv[0] === "--expect") [, expectFile, ...argv] = argv;
const [kubectl, ...overlays] = argv;
if (!kubectl || overlays.length === 0) {
  console.error("usage: node validate_manifests.mjs <kubectl> <overlay dir>...");
  process.exit(2);
}
let checked = 0;
for (const overlay of overlays) {
  let text;
  try {
    text = execFileSync(kubectl, ["kustomize", overlay], { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
  } catch (e) {
    fail(overlay, `kubectl kustomize failed: ${e.stderr || e.message}`);
    continue;
  }
  const objects = [];
  for (const doc of parseAllDocuments(text)) {
    if (doc.errors.length) { fail(overlay, `YAML: ${doc.errors[0].message}`); continue; }
    objects.push(doc.toJS());
  }
  for (const obj of objects) {
    const where = `${overlay} ${obj.kind}/${obj.metadata?.name}`;
    await validateSchema(obj, where);
    checkStrictKeys(obj, where);
  }
  checkConsistency(objects, overlay);
  checked += objects.length;
  console.log(`${overlay}: ${objects.length} objects (${objects.map((o) => o.kind).join(", ")})`);
}
if (expectFile) {
  const expected = readFileSync(expectFile, "utf8").split("\n").filter((l) => l.trim());
  const missed = expected.filter((e) => !failures.some((f) => f.includes(e)));
  const unexpected = failures.filter((f) => !expected.some((e) => f.includes(e)));
  for (const e of missed) console.error(`MISSED (expected, not reported): ${e}`);
  for (const f of unexpected) console.error(`UNEXPECTED: ${f}`);
  console.log(`${expected.length - missed.length} of ${expected.length} planted mistakes reported, ${unexpected.length} unexpected`);
  process.exit(missed.length || unexpected.length ? 1 : 0);
}
for (const f of failures) console.error(`FAIL ${f}`);
console.log(failures.length ? `${failures.length} problems in ${checked} objects` : `all ${checked} objects valid`);
process.exit(failures.length ? 1 : 0);
