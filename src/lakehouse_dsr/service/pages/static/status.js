// The status page: one request, named by the id and status token in the URL fragment. It shows what
// the service answers (never a subject id: the answer holds none), and takes the verification code.
import { api, daysText, hide, NetworkError, problem, REGULATIONS, show, TYPES, when } from "./common.js";

const $ = (id) => document.getElementById(id);
const STATUS = {
  identity_unverified: "We are waiting for you to confirm that it is you (see below).",
  received: "Received: we act on it in our next processing run.",
  in_progress: "We are working on it now.",
  erased: "Your data is erased; removing the last copies from our storage is scheduled.",
  failed: "A step did not succeed yet; we try again automatically.",
  completed: "Done.",
  locked: "Locked after too many wrong codes. Please make a new request.",
};

function request() {
  const params = new URLSearchParams(location.hash.slice(1));
  return { id: params.get("id"), token: params.get("token"), gpc: params.get("gpc") };
}

function showOptional(name, text) {
  $(`${name}-label`).hidden = !text;
  $(name).hidden = !text;
  $(name).textContent = text || "";
}

function render(s) {
  $("status").textContent = s.status;
  $("status").className = `badge status-${s.status}`;
  $("status-text").textContent = STATUS[s.status] || "";
  showOptional("reason", s.reason);
  $("type").textContent = TYPES[s.type] || s.type;
  $("regulation").textContent = REGULATIONS[s.regulation] || s.regulation;
  $("received").textContent = when(s.received);
  $("due-date").textContent = s.due_date;
  $("due-date").setAttribute("datetime", s.due_date);
  $("days-left").textContent = s.completed ? "" : `(${daysText(s.days_left)})`;
  showOptional("completed", when(s.completed));
  $("extended").hidden = !s.extended;
  $("request-id").textContent = s.request_id;
  $("verify").hidden = s.status !== "identity_unverified";
  show($("request"));
  $("checked").textContent = `Checked at ${new Date().toLocaleTimeString()}.`;
}

// Each load is numbered: an answer that arrives after a newer load started (a refresh still in flight
// when the link's fragment changes) belongs to another link and is dropped.
let loads = 0;

async function load() {
  const mine = ++loads;
  const { id, token, gpc } = request();
  hide($("load-error"));
  if (!id || !token) {
    $("request").hidden = $("keep").hidden = $("verify").hidden = true;
    show($("load-error"), "This page shows one request and needs the full link you got when you made it "
      + "(it ends in #id=…&token=…).");
    return;
  }
  $("gpc").hidden = !gpc;
  $("gpc-id").textContent = gpc || "";
  $("link").value = location.href;
  show($("keep"));
  try {
    const answer = await api(`/api/v1/requests/${encodeURIComponent(id)}`, { headers: { "X-Status-Token": token } });
    if (mine !== loads) return;
    if (answer.status === 200) return render(answer.body);
    const message = answer.status === 403
      ? "This link does not match a request: use the full link you got when you made it."
      : problem(answer).message;
    $("request").hidden = $("verify").hidden = true;
    show($("load-error"), message);
  } catch (error) {
    if (!(error instanceof NetworkError)) throw error;
    if (mine === loads) show($("load-error"), error.message);
  }
}

async function act(button, call) {
  hide($("verify-error"));
  hide($("verify-note"));
  button.disabled = true;
  try {
    return await call();
  } catch (error) {
    if (!(error instanceof NetworkError)) throw error;
    show($("verify-error"), error.message);
  } finally {
    button.disabled = false;
  }
  return null;
}

async function verify(event) {
  event.preventDefault();
  const code = $("code").value.trim();
  if (!/^[0-9]{6}$/.test(code)) {
    show($("verify-error"), "The code is the six digits from the e-mail.");
    $("code").setAttribute("aria-invalid", "true");
    $("code").focus();
    return;
  }
  $("code").removeAttribute("aria-invalid");
  const answer = await act($("verify-submit"), () =>
    api(`/api/v1/requests/${encodeURIComponent(request().id)}/verify`, { method: "POST", body: { code } }));
  if (!answer) return;
  if (answer.status === 200) {
    $("code").value = "";
    render(answer.body);
    show($("verify-note"), "Thank you: you are confirmed, and we will act on your request.");
    $("verify").hidden = false; // keeps the thanks in sight; the form itself is done
    $("verify-form").hidden = true;
    return;
  }
  $("code").setAttribute("aria-invalid", "true");
  show($("verify-error"), problem(answer).message);
  if (answer.status === 423) await load(); // locked: the status says so now
}

async function resend() {
  const { id, token } = request();
  const answer = await act($("resend"), () =>
    api(`/api/v1/requests/${encodeURIComponent(id)}/code`, { method: "POST", headers: { "X-Status-Token": token } }));
  if (!answer) return;
  if (answer.status === 202) {
    render(answer.body);
    show($("verify-note"), "A new code is on its way. The code we sent before no longer works.");
  } else {
    show($("verify-error"), problem(answer).message);
  }
}

async function copyLink() {
  const link = $("link");
  try {
    await navigator.clipboard.writeText(link.value);
    $("copied").textContent = "Copied.";
  } catch {
    link.select(); // no clipboard access (plain http, or permission refused): the person copies it
    $("copied").textContent = "Press Ctrl+C (or ⌘C) to copy the selected link.";
  }
}

$("verify-form").addEventListener("submit", verify);
$("resend").addEventListener("click", resend);
$("refresh").addEventListener("click", load);
$("copy").addEventListener("click", copyLink);
window.addEventListener("hashchange", load);
load();
