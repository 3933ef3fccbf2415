// The dashboard: a snapshot of the cluster and its tasks, then the deltas the API folds from the
// log, read from /v1/dashboard/events with fetch + ReadableStream (EventSource cannot send a key).
// Rows are replaced whole by id; ended tasks beyond the newest RECENT_ENDED are dropped, as the
// server's snapshot drops them, and models a delta names as gone are removed. `rates` events
// replace the live tokens/s by instance. The chat box streams through the public /v1/chat/completions.
"use strict";

const RECENT_ENDED = 50;
const RETRY_MS = 2000;
const RETIRED_SHOWN = 3; // per model, the newest retired instances listed under its live ones
const IDS_SHOWN = 6; // task ids listed per batch or queue before "+N more"
const view = { nodes: new Map(), models: new Map(), instances: new Map(), tasks: new Map(), rates: {}, lastSeq: 0 };
let key = sessionStorage.getItem("shoal.key") || "";
let drawPending = false;

function authHeaders(extra = {}) {
  return key ? { ...extra, authorization: `Bearer ${key}` } : extra;
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, value);
  for (const child of children) node.append(child);
  return node;
}

function badge(text) {
  return el("span", { class: `badge ${text}` }, text);
}

function gib(bytes) {
  // in MiB under a GiB: a small model's few MiB would read as "0.0 GiB"
  if (bytes >= 2 ** 30) return `${(bytes / 2 ** 30).toFixed(1)} GiB`;
  const mib = bytes / 2 ** 20;
  return `${mib.toFixed(mib && mib < 10 ? 1 : 0)} MiB`;
}

function meter(part, whole, title) {
  const share = whole ? Math.min(100, Math.round((100 * part) / whole)) : 0;
  return el("span", { class: "bar memory", title }, el("span", { style: `width:${share}%` }));
}

// --- the feed -------------------------------------------------------------------------------

async function follow() {
  for (;;) {
    try {
      const response = await fetch("/v1/dashboard/events", { headers: authHeaders() });
      if (response.status === 401 || response.status === 403) {
        const body = await response.json();
        askForKey(body.error.message);
        return;
      }
      setConnection("live");
      await readEvents(response.body, onEvent);
    } catch (error) {
      console.warn("dashboard feed:", error);
    }
    setConnection("offline");
    await new Promise((resolve) => setTimeout(resolve, RETRY_MS));
  }
}

async function readEvents(stream, handle) {
  const reader = stream.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let kind = "message";
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event: ")) kind = line.slice(7);
        else if (line.startsWith("data: ")) data.push(line.slice(6));
      }
      if (data.length) handle(kind, data.join("\n"));
    }
  }
}

function onEvent(kind, data) {
  const body = JSON.parse(data);
  if (kind === "rates") {
    view.rates = body.tokens_per_second;
    scheduleDraw();
    return;
  }
  if (kind === "snapshot") {
    for (const rows of [view.nodes, view.models, view.instances, view.tasks]) rows.clear();
  } else if (body.seq <= view.lastSeq) {
    return;
  }
  for (const row of body.nodes) view.nodes.set(row.node_id, row);
  for (const row of body.models) view.models.set(row.model, row);
  for (const model of body.gone_models || []) view.models.delete(model);
  for (const row of body.instances) view.instances.set(row.instance_id, row);
  for (const row of body.tasks) view.tasks.set(row.task_id, row);
  view.lastSeq = body.last_seq ?? body.seq;
  trimEnded();
  scheduleDraw();
}

function trimEnded() {
  const ended = [...view.tasks.values()].filter((t) => t.ended_seq > 0).sort((a, b) => b.ended_seq - a.ended_seq);
  for (const task of ended.slice(RECENT_ENDED)) view.tasks.delete(task.task_id);
}

// --- drawing --------------------------------------------------------------------------------

function scheduleDraw() {
  if (drawPending) return;
  drawPending = true;
  requestAnimationFrame(() => {
    drawPending = false;
    draw();
  });
}

function draw() {
  document.getElementById("last-seq").textContent = `log seq ${view.lastSeq}`;
  document.querySelector("#nodes tbody").replaceChildren(...[...view.nodes.values()].map(drawNode));
  const models = [...view.models.values()].map(drawModel);
  document.getElementById("models").replaceChildren(...models);
  document.getElementById("no-models").hidden = models.length > 0;
  const tasks = [...view.tasks.values()].sort(taskOrder).map(drawTask);
  document.querySelector("#tasks tbody").replaceChildren(...tasks);
  document.getElementById("no-tasks").hidden = tasks.length > 0;
}

function drawNode(node) {
  // What placement sees: the node's budget less what live instances reserve on it, and no more
  // than its host has left once every node on that host took its share.
  const free = Math.max(0, Math.min(node.memory_bytes - node.reserved_bytes, node.host_memory_bytes - node.host_reserved_bytes));
  const memory = el("div", { class: "memory-cell" },
    el("div", { class: "rank" }, meter(node.reserved_bytes, node.memory_bytes, "reserved of this node's budget"),
      `${gib(node.reserved_bytes)} of ${gib(node.memory_bytes)}`, el("span", { class: "quiet" }, `· ${gib(free)} free`)),
    el("div", { class: "quiet small" }, `host ${gib(node.host_reserved_bytes)} of ${gib(node.host_memory_bytes)} reserved by its nodes`));
  return el("tr", { "data-node": node.node_id },
    el("td", {}, el("code", {}, node.node_id)), el("td", {}, node.host), el("td", {}, String(node.cores)),
    el("td", {}, memory), el("td", {}, badge(node.status), " ", node.reason));
}

function drawModel(model) {
  const instances = [...view.instances.values()].filter((i) => i.model === model.model);
  const live = instances.filter((i) => i.state !== "retired");
  const retired = instances.filter((i) => i.state === "retired").slice(-RETIRED_SHOWN).reverse();
  const rate = live.reduce((sum, i) => sum + (view.rates[i.instance_id] || 0), 0);
  const head = el("h3", {}, el("span", { class: "model-name" }, model.model), " ", badge(model.state),
    model.pinned ? " " : "", model.pinned ? badge("pinned") : "",
    el("span", { class: "rate" }, `${rate.toFixed(1)} tok/s`));
  const notes = [];
  if (model.waiting.length) notes.push(el("div", { class: "tasks-line" }, "waiting for an instance: ", ...taskIds(model.waiting, "waiting")));
  if (model.error) notes.push(el("div", { class: "problem" }, model.error));
  for (const d of model.downloads) {
    notes.push(el("div", { class: "rank" }, "downloading on ", el("code", {}, d.node_id),
      meter(d.bytes_done, d.bytes_total, "downloaded"), d.bytes_total ? `${gib(d.bytes_done)} of ${gib(d.bytes_total)}` : gib(d.bytes_done)));
  }
  const gone = retired.map((i) => el("div", { class: "quiet small retired-line" }, "retired ", el("code", {}, i.instance_id),
    i.retire_reason ? `: ${i.retire_reason}` : ""));
  return el("div", { class: "model", "data-model": model.model, "data-state": model.state }, head, ...notes, ...live.map(drawInstance), ...gone);
}

function drawInstance(instance) {
  const rate = view.rates[instance.instance_id] || 0;
  const shards = instance.shards.map((s) =>
    el("div", { class: "shard" }, el("div", {}, `rank ${s.rank} on `, el("code", {}, s.node_id), " ", badge(s.status)),
      el("div", { class: "quiet" }, `layers ${s.start_layer}–${s.end_layer - 1} · ${gib(s.memory_bytes)} reserved`)));
  return el("div", { class: "instance", "data-instance": instance.instance_id, "data-state": instance.state },
    el("h4", {}, el("code", {}, instance.instance_id), " ", badge(instance.state),
      el("span", { class: "rate", "data-rate": instance.instance_id }, `${rate.toFixed(1)} tok/s`)),
    el("div", { class: "placement quiet small", title: instance.placement_reason }, instance.placement_reason),
    el("div", { class: "shards" }, ...shards),
    el("div", { class: "tasks-line" }, el("span", { class: "label" }, `running ${instance.running.length}`), ...taskIds(instance.running, "running")),
    el("div", { class: "tasks-line" }, el("span", { class: "label" }, `queued ${instance.queued.length}`), ...taskIds(instance.queued, "queued")));
}

function taskIds(ids, kind) {
  const shown = ids.slice(0, IDS_SHOWN).map((id) => el("code", { class: `task-id ${kind}` }, id));
  return ids.length > IDS_SHOWN ? [...shown, el("span", { class: "quiet" }, ` +${ids.length - IDS_SHOWN} more`)] : shown;
}

function taskOrder(a, b) {
  // running tasks first (oldest first), then ended ones, newest first
  if (!a.ended_seq !== !b.ended_seq) return a.ended_seq ? 1 : -1;
  return a.ended_seq ? b.ended_seq - a.ended_seq : a.created_at - b.created_at;
}

function taskState(task) {
  return task.stalled && !task.ended_seq ? "stalled" : task.status;
}

function drawTask(task) {
  const ranks = task.ranks.map((r) => {
    const share = r.total ? Math.round((100 * r.processed) / r.total) : 0;
    return el("div", { class: "rank" }, `rank ${r.rank}`, el("span", { class: "bar" }, el("span", { style: `width:${share}%` })),
      `${r.processed}/${r.total}`, el("span", { class: "quiet" }, `it ${r.iteration}`));
  });
  const problem = task.error || task.stalled; // a stalled task fails with an error that carries the diagnosis
  const link = el("a", { href: `/debug/timeline?task=${encodeURIComponent(task.task_id)}`, target: "_blank" }, "timeline & diagnosis");
  link.addEventListener("click", (event) => openWithKey(event, link.href));
  const finish = task.finish_reason ? ` (${task.finish_reason})` : "";
  return el("tr", { "data-task": task.task_id },
    el("td", {}, el("code", {}, task.task_id)), el("td", {}, task.model),
    el("td", {}, task.instance_id ? el("code", {}, task.instance_id) : el("span", { class: "quiet" }, "—")),
    el("td", {}, badge(taskState(task)), finish),
    el("td", {}, ...ranks), el("td", {}, String(task.completion_tokens)),
    el("td", { class: "problem" }, problem), el("td", {}, link));
}

async function openWithKey(event, href) {
  // A link cannot carry the key: with one, fetch the page and show it from a blob.
  if (!key) return;
  event.preventDefault();
  const response = await fetch(href, { headers: authHeaders() });
  const blob = new Blob([await response.text()], { type: "text/html" });
  window.open(URL.createObjectURL(blob), "_blank");
}

function setConnection(state) {
  const connection = document.getElementById("connection");
  connection.textContent = state;
  connection.className = `badge ${state}`;
}

function askForKey(message) {
  setConnection("offline");
  document.getElementById("key-form").hidden = false;
  document.getElementById("key-problem").textContent = message;
}

// --- chat -----------------------------------------------------------------------------------

async function loadModels() {
  const response = await fetch("/v1/models", { headers: authHeaders() });
  if (!response.ok) return;
  const models = (await response.json()).data.map((m) => el("option", { value: m.id }, m.id));
  document.getElementById("chat-model").replaceChildren(...models);
}

async function chat(event) {
  event.preventDefault();
  const input = document.getElementById("chat-input");
  const output = document.getElementById("chat-output");
  output.textContent = "";
  const response = await fetch("/v1/chat/completions", {
    method: "POST",
    headers: authHeaders({ "content-type": "application/json" }),
    body: JSON.stringify({
      model: document.getElementById("chat-model").value,
      messages: [{ role: "user", content: input.value }],
      max_tokens: Number(document.getElementById("chat-max-tokens").value),
      stream: true,
    }),
  });
  if (!response.ok) {
    output.textContent = (await response.json()).error.message;
    return;
  }
  await readEvents(response.body, (kind, data) => {
    if (data === "[DONE]") return;
    const chunk = JSON.parse(data);
    if (chunk.error) output.textContent += `\n[${chunk.error.message}]`;
    for (const choice of chunk.choices || []) output.textContent += choice.delta.content || "";
  });
}

function useKey(event) {
  event.preventDefault();
  key = document.getElementById("key-input").value.trim();
  sessionStorage.setItem("shoal.key", key);
  document.getElementById("key-form").hidden = true;
  loadModels();
  follow();
}

document.getElementById("key-form").addEventListener("submit", useKey);
document.getElementById("chat-form").addEventListener("submit", chat);
loadModels();
follow();
