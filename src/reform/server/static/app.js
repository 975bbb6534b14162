// The reform web page: upload a document (POST /v1/contexts), watch its encode, ask it questions over the
// streamed chat API (POST /v1/chat/completions with context_id), list and delete stored contexts.
// Plain browser JavaScript, no build step, no CDN: it only calls this server's own API.
"use strict";
const $ = (id) => document.getElementById(id);
let chosen = null;
const NONE_CHOSEN = "none (the model answers alone)";

function headers(json = true) {
  const h = json ? {"Content-Type": "application/json"} : {};
  const key = $("api-key").value.trim();
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

async function api(path, options = {}) {
  const r = await fetch(path, {...options, headers: {...headers(), ...(options.headers || {})}});
  const body = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error((body.error && body.error.message) || r.status + " " + r.statusText);
  return body;
}

function size(bytes) {
  if (bytes == null) return "";
  return bytes > 1e6 ? (bytes / 1e6).toFixed(1) + " MB" : (bytes / 1e3).toFixed(0) + " kB";
}

function choose(id) {
  chosen = id;
  $("chosen").textContent = id;
  for (const tr of document.querySelectorAll("#contexts tbody tr")) tr.classList.toggle("chosen", tr.dataset.id === id);
}

async function refresh() {
  let list;
  try { list = (await api("/v1/contexts")).data; } catch (e) { $("upload-status").textContent = e.message; return; }
  const body = $("contexts").querySelector("tbody");
  body.replaceChildren(...list.map((c) => {
    const tr = document.createElement("tr");
    tr.dataset.id = c.id;
    tr.className = c.id === chosen ? "chosen" : "";
    const cells = [c.id.slice(0, 12) + "…", c.status, c.tokens, size(c.bytes)];
    for (const v of cells) { const td = document.createElement("td"); td.textContent = v; tr.append(td); }
    const td = document.createElement("td");
    const use = document.createElement("button");
    use.textContent = "use"; use.disabled = c.status !== "ready"; use.onclick = () => choose(c.id);
    const del = document.createElement("button");
    del.textContent = "delete";
    del.onclick = async () => {
      await api("/v1/contexts/" + c.id, {method: "DELETE"}).catch((e) => alert(e.message));
      if (chosen === c.id) { chosen = null; $("chosen").textContent = NONE_CHOSEN; }
      refresh();
    };
    td.append(use, " ", del);
    tr.append(td);
    return tr;
  }));
}

let droppedFile = null;      // a document dropped or chosen: sent as it is (multipart), the server extracts it

function setFile(file) {
  droppedFile = file;
  $("file-row").hidden = !file;
  $("file-name").textContent = file ? `${file.name} (${size(file.size)})` : "";
  $("document").disabled = !!file;
}

async function upload() {
  const text = $("document").value;
  const status = $("upload-status"), bar = $("progress");
  if (!droppedFile && !text.trim()) { status.textContent = "the document is empty"; return; }
  $("upload").disabled = true;
  try {
    let body;
    if (droppedFile) { body = new FormData(); body.append("file", droppedFile, droppedFile.name); }
    let c = droppedFile
      ? await fetch("/v1/contexts", {method: "POST", headers: headers(false), body}).then(async (r) => {
          const j = await r.json().catch(() => ({}));
          if (!r.ok) throw new Error((j.error && j.error.message) || r.status + " " + r.statusText);
          return j;
        })
      : await api("/v1/contexts", {method: "POST", body: JSON.stringify({text})});
    bar.hidden = false;
    while (c.status === "queued" || c.status === "encoding") {
      bar.value = c.tokens ? c.tokens_encoded / c.tokens : 0;
      status.textContent = `${c.status}: ${c.tokens_encoded} of ${c.tokens} tokens`;
      await new Promise((r) => setTimeout(r, 500));
      c = await api("/v1/contexts/" + c.id);
    }
    bar.value = 1;
    if (c.status !== "ready") throw new Error(c.error || c.status);
    status.textContent = `ready: ${c.tokens} tokens` + (c.encode_seconds ? ` in ${c.encode_seconds.toFixed(1)} s` : "");
    status.dataset.state = "ready";
    choose(c.id);
  } catch (e) {
    status.textContent = "failed: " + e.message;
    status.dataset.state = "failed";
  } finally {
    $("upload").disabled = false;
    refresh();
  }
}

async function ask() {
  const question = $("question").value.trim();
  if (!question) return;
  const q = document.createElement("div"); q.className = "q"; q.textContent = question;
  const a = document.createElement("div"); a.className = "a";
  $("log").append(q, a);
  $("ask").disabled = true;
  a.dataset.state = "streaming";
  try {
    const r = await fetch("/v1/chat/completions", {method: "POST", headers: headers(), body: JSON.stringify({
      model: "reform", ...(chosen ? {context_id: chosen} : {}), stream: true,   // none: the model alone
      max_tokens: Number($("max-tokens").value) || 256,
      messages: [{role: "user", content: question}]})});
    if (!r.ok) {
      const body = await r.json().catch(() => ({}));
      throw new Error((body.error && body.error.message) || r.status + " " + r.statusText);
    }
    const reader = r.body.getReader(), decoder = new TextDecoder();
    let pending = "";
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      pending += decoder.decode(value, {stream: true});
      let end;
      while ((end = pending.indexOf("\n\n")) >= 0) {          // one server-sent event
        const event = pending.slice(0, end); pending = pending.slice(end + 2);
        if (!event.startsWith("data: ") || event === "data: [DONE]") continue;   // ": ..." keep-alive comments
        const chunk = JSON.parse(event.slice(6));
        if (chunk.error) throw new Error(chunk.error.message);
        for (const c of chunk.choices || []) a.textContent += (c.delta && c.delta.content) || "";
        if (chunk.reform) showEvidence(a, chunk.reform);
      }
    }
    a.dataset.state = "done";
  } catch (e) {
    a.classList.add("error");
    a.textContent += (a.textContent ? "\n" : "") + e.message;
    a.dataset.state = "failed";
  } finally {
    $("ask").disabled = false;
  }
}

// The passages the answer was recomputed from, with document and page (or section and line), best first.
function showEvidence(answer, reform) {
  const list = document.createElement("ol");
  list.className = "evidence";
  for (const p of (reform.evidence || []).slice(0, 3)) {
    const li = document.createElement("li");
    const where = document.createElement("div");
    where.className = "where";
    const unit = p.unit || "page";     // page (PDF, scan), slide (deck) or row (sheet, whose name is the section)
    const pages = p.page == null ? `line ${p.line}` : (p.page_end && p.page_end !== p.page ? `${unit}s ${p.page}-${p.page_end}` : `${unit} ${p.page}`);
    where.textContent = (unit === "row" ? [p.document, p.section, pages] : [p.document, pages, p.section]).filter(Boolean).join(" · ");
    const text = document.createElement("div");
    const words = p.text.replace(/\s+/g, " ");
    text.textContent = words.length > 320 ? words.slice(0, 200) + " … " + words.slice(-100) : words;
    li.append(where, text);
    list.append(li);
  }
  if (list.children.length) {
    const title = document.createElement("div");
    title.className = "muted evidence-title";
    title.textContent = "Evidence";
    answer.after(title, list);
  }
}

$("upload").onclick = upload;
$("ask").onclick = ask;
$("question").addEventListener("keydown", (e) => { if (e.key === "Enter") ask(); });
$("api-key").value = localStorage.getItem("reform-api-key") || "";
$("api-key").addEventListener("change", () => { localStorage.setItem("reform-api-key", $("api-key").value); refresh(); });
const drop = $("drop");
drop.addEventListener("dragover", (e) => { e.preventDefault(); drop.classList.add("over"); });
drop.addEventListener("dragleave", () => drop.classList.remove("over"));
drop.addEventListener("drop", (e) => {
  e.preventDefault(); drop.classList.remove("over");
  if (e.dataTransfer.files.length) setFile(e.dataTransfer.files[0]);
});
$("file").addEventListener("change", () => { if ($("file").files.length) setFile($("file").files[0]); });
$("clear-file").onclick = () => { $("file").value = ""; setFile(null); };
fetch("/v1/models", {headers: headers(false)}).then((r) => r.json()).then((m) => {
  if (m.data) $("model").textContent = m.data[0].id + " · " + m.data[0].method +
    (m.data[0].documents_method && m.data[0].documents_method !== m.data[0].method ? "; documents: " + m.data[0].documents_method : "");
}).catch(() => {});
refresh();
