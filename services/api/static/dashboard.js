// The dashboard: a snapshot of the cluster and its tasks, then the deltas the API folds from the
// log, read from /v1/dashboard/events with fetch + ReadableStream (EventSource cannot send a key).
// Rows are replaced whole by id; ended tasks beyond the newest RECENT_ENDED are dropped, as the
// server's snapshot drops them. The chat box streams through the public /v1/chat/completions.
"use strict";

const RECENT_ENDED = 50;
const RETRY_MS = 2000;
const view = { nodes: new Map(), instances: new Map(), tasks: new Map(), lastSeq: 0 };
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
  return `${(bytes / 2 ** 30).toFixed(1)} GiB`;
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
  if (kind === "snapshot") {
    view.nodes.clear();
    view.instances.clear();
    view.tasks.clear();
  } else if (body.seq <= view.lastSeq) {
    return;
  }
  for (const row of body.nodes) view.nodes.set(row.node_id, row);
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
  const nodes = [...view.nodes.values()].map((n) =>
    el("tr", {}, el("td", {}, el("code", {}, n.node_id)), el("td", {}, n.host), el("td", {}, String(n.cores)),
      el("td", {}, gib(n.memory_bytes)), el("td", {}, n.backend), el("td", {}, badge(n.status), " ", n.reason)));
  document.querySelector("#nodes tbody").replaceChildren(...nodes);
  document.getElementById("instances").replaceChildren(...[...view.instances.values()].map(drawInstance));
  const tasks = [...view.tasks.values()].sort(taskOrder).map(drawTask);
  document.querySelector("#tasks tbody").replaceChildren(...tasks);
  document.getElementById("no-tasks").hidden = tasks.length > 0;
}

function instanceState(instance) {
  return instance.retired ? "retired" : instance.failed ? "failed" : instance.ready ? "ready" : "loading";
}

function drawInstance(instance) {
  const shards = instance.shards.map((s) =>
    el("div", { class: "shard" }, `rank ${s.rank} on `, el("code", {}, s.node_id), el("br"),
      `layers ${s.start_layer}–${s.end_layer - 1} `, badge(s.status)));
  const queue = instance.queue.length ? `queue: ${instance.queue.join(", ")}` : "queue empty";
  return el("div", { class: "instance" },
    el("h3", {}, el("code", {}, instance.instance_id), ` ${instance.model} `, badge(instanceState(instance))),
    el("div", { class: "shards" }, ...shards), el("div", { class: "quiet" }, queue));
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
    el("td", {}, el("code", {}, task.task_id)), el("td", {}, task.model), el("td", {}, badge(taskState(task)), finish),
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
