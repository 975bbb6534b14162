// The reform web page: drop documents into a library (POST /v1/files, then a vector store's files), or paste
// a text (POST /v1/contexts); watch their encodes; ask the ticked documents or the chosen text over the
// streamed chat API (POST /v1/chat/completions with vector_store_ids and file_ids, or context_id).
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
  for (const key of ticked.keys()) ticked.set(key, false);      // a chosen text: the library's documents untick
  for (const box of document.querySelectorAll("#library input")) box.checked = false;
  showChosen();
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
showLibrary();
    };
    td.append(use, " ", del);
    tr.append(td);
    return tr;
  }));
}

// ---------------------------------------------------------------- the library: a vector store of this page's
const LIBRARY_NAME = "web page library";
let library = null;                  // its id, found or made at the first drop
const ticked = new Map();           // file id -> ticked (a completed file starts ticked)

async function libraryId(make) {
  if (library) return library;
  const found = (await api("/v1/vector_stores")).data.find((v) => v.name === LIBRARY_NAME);
  if (found) return (library = found.id);
  if (!make) return null;
  return (library = (await api("/v1/vector_stores", {method: "POST", body: JSON.stringify({name: LIBRARY_NAME})})).id);
}

async function addFiles(files) {
  const status = $("library-status");
  try {
    const id = await libraryId(true);
    for (const file of files) {
      status.textContent = `uploading ${file.name}`;
      const body = new FormData(); body.append("file", file, file.name); body.append("purpose", "assistants");
      const made = await fetch("/v1/files", {method: "POST", headers: headers(false), body}).then(async (r) => {
        const j = await r.json().catch(() => ({}));
        if (!r.ok) throw new Error(`${file.name}: ` + ((j.error && j.error.message) || r.status));
        return j;
      });
      await api(`/v1/vector_stores/${id}/files`, {method: "POST", body: JSON.stringify({file_id: made.id})});
      await showLibrary();
    }
    status.textContent = "";
  } catch (e) { status.textContent = "failed: " + e.message; }
  await showLibrary();
}

async function showLibrary() {
  const id = await libraryId(false).catch(() => null);
  if (!id) return;
  const files = (await api(`/v1/vector_stores/${id}/files?limit=1000`)).data.slice().reverse();
  $("library").querySelector("tbody").replaceChildren(...files.map((f) => {
    const tr = document.createElement("tr");
    tr.dataset.id = f.id; tr.dataset.status = f.status;
    const box = document.createElement("input");
    box.type = "checkbox"; box.disabled = f.status !== "completed";
    if (f.status === "completed" && !ticked.has(f.id)) ticked.set(f.id, true);
    box.checked = !!ticked.get(f.id); box.onchange = () => { ticked.set(f.id, box.checked); showChosen(); };
    const name = (f.attributes && f.attributes.filename) || f.id;
    const cells = [box, name, f.status + (f.last_error ? ": " + f.last_error.message : ""),
                   (f.attributes && f.attributes.tokens) || ""];
    for (const v of cells) { const td = document.createElement("td"); td.append(v); tr.append(td); }
    const del = document.createElement("button");
    del.textContent = "remove";
    del.onclick = async () => { await api(`/v1/vector_stores/${id}/files/${f.id}`, {method: "DELETE"}); ticked.delete(f.id); showLibrary(); };
    const td = document.createElement("td"); td.append(del); tr.append(td);
    return tr;
  }));
  showChosen();
  if (files.some((f) => f.status === "in_progress")) setTimeout(showLibrary, 500);
}

function tickedFiles() {
  return [...document.querySelectorAll("#library tbody tr")]
    .filter((tr) => tr.dataset.status === "completed" && ticked.get(tr.dataset.id)).map((tr) => tr.dataset.id);
}

function showChosen() {
  const n = tickedFiles().length;
  $("chosen").textContent = n ? `${n} document${n > 1 ? "s" : ""} of the library` : (chosen || NONE_CHOSEN);
}

async function upload() {
  const text = $("document").value;
  const status = $("upload-status"), bar = $("progress");
  if (!text.trim()) { status.textContent = "the text is empty"; return; }
  $("upload").disabled = true;
  try {
    let c = await api("/v1/contexts", {method: "POST", body: JSON.stringify({text})});
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
showLibrary();
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
    const files = tickedFiles();
    const about = files.length ? {vector_store_ids: [library], file_ids: files} : chosen ? {context_id: chosen} : {};
    const r = await fetch("/v1/chat/completions", {method: "POST", headers: headers(), body: JSON.stringify({
      model: "reform", ...about, stream: true,   // none: the model alone
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
$("api-key").addEventListener("change", () => {
  localStorage.setItem("reform-api-key", $("api-key").value); library = null; ticked.clear(); refresh(); showLibrary();
});
const drop = $("drop");
drop.addEventListener("dragover", (e) => { e.preventDefault(); drop.classList.add("over"); });
drop.addEventListener("dragleave", () => drop.classList.remove("over"));
drop.addEventListener("drop", (e) => {
  e.preventDefault(); drop.classList.remove("over");
  if (e.dataTransfer.files.length) addFiles([...e.dataTransfer.files]);
});
$("file").addEventListener("change", () => { if ($("file").files.length) addFiles([...$("file").files]); $("file").value = ""; });
fetch("/v1/models", {headers: headers(false)}).then((r) => r.json()).then((m) => {
  if (m.data) $("model").textContent = m.data[0].id + " · " + m.data[0].method +
    (m.data[0].documents_method && m.data[0].documents_method !== m.data[0].method ? "; documents: " + m.data[0].documents_method : "");
}).catch(() => {});
refresh();
showLibrary();
