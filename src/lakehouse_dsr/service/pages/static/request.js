// The request form: files one request, then moves to its status page with the id and status token in
// the URL fragment (a fragment is never sent to a server, so neither reaches any log).
import { api, hide, NetworkError, problem, show } from "./common.js";

const form = document.getElementById("request-form");
const button = document.getElementById("submit");
const formError = document.getElementById("form-error");
const emailGroup = document.getElementById("email-group");
const FIELDS = ["type", "regulation", "subject_id", "email"];
const VERIFIED = new Set(["erase", "access"]); // opt-outs are never verified, so they carry no e-mail

// The attempt still without an answer: sending the same filing again reuses its Idempotency-Key, so a
// request whose acknowledgement was lost on the way is not filed twice.
let pending = null;

function newKey() {
  if (crypto.randomUUID) return crypto.randomUUID();
  // randomUUID exists only in secure contexts (https, localhost); the same 122 random bits otherwise
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  bytes[6] = (bytes[6] & 0x0f) | 0x40;
  bytes[8] = (bytes[8] & 0x3f) | 0x80;
  const hex = Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}

function filing() {
  const data = new FormData(form);
  const body = { type: data.get("type"), regulation: data.get("regulation"), subject_id: data.get("subject_id") };
  const email = String(data.get("email") || "").trim();
  if (VERIFIED.has(body.type) && email) body.email = email;
  return body;
}

function fieldError(field, message) {
  show(document.getElementById(`${field}-error`), message);
  const input = document.getElementById(field);
  if (input.tagName === "INPUT") input.setAttribute("aria-invalid", "true");
}

function clearErrors() {
  hide(formError);
  for (const field of FIELDS) {
    hide(document.getElementById(`${field}-error`));
    document.getElementById(field).removeAttribute("aria-invalid");
  }
}

function focusFirstProblem() {
  const invalid = form.querySelector("[aria-invalid=true]");
  (invalid || formError).focus();
}

function toStatusPage(ack) {
  const fragment = new URLSearchParams({ id: ack.request_id, token: ack.status_token });
  if (ack.gpc_opt_out_request_id) fragment.set("gpc", ack.gpc_opt_out_request_id);
  form.reset(); // the identifier does not stay in the page the back button returns to
  pending = null;
  location.assign(`/status#${fragment}`);
}

async function submit(event) {
  event.preventDefault();
  clearErrors();
  const body = filing();
  if (!String(body.subject_id || "").trim()) {
    fieldError("subject_id", "Enter the identifier we know you by.");
    focusFirstProblem();
    return;
  }
  const text = JSON.stringify(body);
  if (!pending || pending.text !== text) pending = { key: newKey(), text };
  button.disabled = true;
  try {
    const answer = await api("/api/v1/requests", { method: "POST", body, headers: { "Idempotency-Key": pending.key } });
    if (answer.status === 202) {
      toStatusPage(answer.body);
      return;
    }
    // 429 and 5xx acknowledged nothing: sending again under the same key is right; any other answer is final
    if (answer.status !== 429 && answer.status < 500) pending = null;
    const { message, fields } = problem(answer);
    const marked = [...fields].filter(([field]) => FIELDS.includes(field));
    for (const [field, why] of marked) fieldError(field, why);
    if (fields.has("email")) emailGroup.hidden = false;
    // a problem with a field is told beside it (and focused); anything else above the button
    if (marked.length < Math.max(fields.size, 1)) show(formError, message);
  } catch (error) {
    if (!(error instanceof NetworkError)) throw error;
    show(formError, `${error.message} Sending again is safe: the same request is never filed twice.`);
  } finally {
    button.disabled = false;
  }
  focusFirstProblem();
}

function typeChanged() {
  emailGroup.hidden = !VERIFIED.has(new FormData(form).get("type"));
}

formError.tabIndex = -1;
form.addEventListener("submit", submit);
button.disabled = false; // off in the HTML: without this script the form must not be sent
form.addEventListener("change", typeChanged);
typeChanged();
if (navigator.globalPrivacyControl) show(document.getElementById("gpc-on"));
