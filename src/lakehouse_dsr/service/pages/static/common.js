// What the three pages share: calling the service, reading its refusals, building DOM nodes.
// Text goes in through textContent only, so nothing the service answers is ever parsed as HTML.

export class NetworkError extends Error {}

/** Call the service; resolves to {status, body} for any HTTP answer, rejects with NetworkError when
 *  none arrived (offline, server down), when the request may or may not have been acted on. */
export async function api(path, { method = "GET", body, headers = {} } = {}) {
  const init = { method, headers: { Accept: "application/json", ...headers }, cache: "no-store" };
  if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers["Content-Type"] = "application/json";
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch {
    throw new NetworkError("The service could not be reached. Check your connection and try again.");
  }
  let parsed = null;
  try {
    parsed = await response.json();
  } catch {
    parsed = null; // a proxy's HTML error page: the status code still says what happened
  }
  return { status: response.status, body: parsed };
}

/** The service's refusal as {message, fields}: `detail` is the text for people; `fields` maps each
 *  field to fix (`field`, or the `errors` of a validation failure) to what is wrong with it. */
export function problem(answer) {
  const body = answer.body || {};
  const message = typeof body.detail === "string" ? body.detail
    : `The service answered with an error (HTTP ${answer.status}). Please try again later.`;
  const fields = new Map();
  if (typeof body.field === "string") fields.set(body.field, message);
  for (const error of Array.isArray(body.errors) ? body.errors : []) fields.set(error.field, error.message);
  return { message, fields };
}

export function show(element, text) {
  if (text !== undefined) element.textContent = text;
  element.hidden = false;
}

export function hide(element) {
  element.hidden = true;
  element.textContent = "";
}

/** An HTML element: attributes (class, id, ...) and children (nodes or text). */
export function h(tag, attributes = {}, ...children) {
  return build(document.createElement(tag), attributes, children);
}

/** An SVG element, same shape as h(). */
export function svg(tag, attributes = {}, ...children) {
  return build(document.createElementNS("http://www.w3.org/2000/svg", tag), attributes, children);
}

function build(node, attributes, children) {
  for (const [name, value] of Object.entries(attributes)) {
    if (value !== undefined && value !== null && value !== false) node.setAttribute(name, String(value));
  }
  for (const child of children.flat()) {
    if (child !== undefined && child !== null) node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

/** "12 days left", "due today", "3 days overdue"; "" when there is no deadline (completed). */
export function daysText(days) {
  if (days === null || days === undefined) return "";
  if (days < 0) return `${-days} day${days === -1 ? "" : "s"} overdue`;
  if (days === 0) return "due today";
  return `${days} day${days === 1 ? "" : "s"} left`;
}

/** "2026-11-23T18:33:42Z" as "2026-11-23 18:33 UTC" (the service speaks UTC). */
export function when(iso) {
  if (!iso) return "";
  const match = /^(\d{4}-\d{2}-\d{2})T(\d{2}:\d{2})/.exec(iso);
  return match ? `${match[1]} ${match[2]} UTC` : iso;
}

export const TYPES = {
  erase: "Erase my personal data",
  access: "Send me a copy of my personal data",
  opt_out: "Do not sell or share my personal data",
  opt_in: "Allow selling or sharing again",
};

export const REGULATIONS = { gdpr: "GDPR (EU, UK)", ccpa: "CCPA (California)" };
