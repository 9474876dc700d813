"""The intake pages in a real browser: Debian's headless Chromium, driven by selenium, against `dsr serve`
on a free port with a real SMTP server. A person files requests through the form, follows them on the
status page and confirms a mailed code there; an operator opens the dashboard. Each step checks what
a person sees (text, elements, classes and colours) and takes a screenshot into the test's tmp dir;
with DSR_SCREENSHOTS=DIR set, the form, status page and dashboard also go to DIR (the docs' pictures:
`DSR_SCREENSHOTS=docs/screenshots`, shown by mkdocs/docs/service/pages.md).

Run: `.venv/bin/python -m pytest -q tests/integration/test_pages.py` (`make integration-deps` installs
chromium and chromium-driver)."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import date, timedelta
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait

from intake_server import OPERATOR_TOKEN, Mailbox, Served, intake_config, served
from lakehouse_dsr.config import Settings, load_settings
from lakehouse_dsr.ledger.ledger import Ledger, RunRecord
from lakehouse_dsr.ledger.requests import RequestInput, utc_now

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed at /usr/bin/"
                                "chromium (make integration-deps installs chromium and chromium-driver)")
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")


@dataclass
class Site:
    """The served intake on a fresh catalog, with backdated requests and two runs in its ledger."""

    server: Served
    settings: Settings
    mailbox: Mailbox
    seeded: dict[str, str]  # urgency -> request id of a backdated request
    subjects: list[str] = field(default_factory=list)  # every subject id used: none may show in a page

    def subject(self, shape: str = "", prefix: str = "pages-") -> str:
        """A fresh, made-up subject id (`shape` makes it look hostile), remembered for the page checks."""
        subject = f"{prefix}{secrets.token_hex(6)}{shape}"
        self.subjects.append(subject)
        return subject

    def assert_no_subject(self, driver: WebDriver) -> None:
        source = driver.page_source
        shown = [s for s in self.subjects if s in source or s.split("<")[0] in source]
        assert not shown, f"{len(shown)} subject id(s) appear in {driver.current_url.split('#')[0]}"


def _runs() -> list[RunRecord]:
    start = utc_now() - timedelta(hours=2)
    tables = {"demo.events": {"action": "delete", "rows": 120, "bytes_rewritten": 48_000, "files_rewritten": 3},
              "demo.users": {"action": "delete", "rows": 4, "bytes_rewritten": 2_100, "files_rewritten": 1}}
    return [RunRecord("run-older", start, start + timedelta(seconds=19),
                      {"ledger": 1.5, "resolve": 2.0, "erase": 9.0, "purge": 4.5, "verify": 2.0}, tables, 4, 0, 0),
            RunRecord("run-newer", start + timedelta(hours=1), start + timedelta(hours=1, seconds=9),
                      {"ledger": 1.0, "resolve": 1.0, "erase": 3.0, "verify": 2.0, "export": 2.0},
                      {"demo.events": {**tables["demo.events"], "rows": 30}}, 2, 1, 0)]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Iterator[Site]:
    root = tmp_path_factory.mktemp("pages")
    mailbox = Mailbox().start()
    try:
        config = intake_config(root, verification="email_code", smtp={"host": "127.0.0.1", "port": mailbox.port})
        settings = load_settings(config)
        ledger = Ledger(settings)
        overdue, soon, later = (f"seed-{secrets.token_hex(6)}" for _ in range(3))
        # GDPR: due a month after receipt, so 40 days ago is overdue; CCPA: 45 days, so 40 days ago is due soon.
        # A request received today is due later: the dashboard shows all three urgencies whichever tests ran
        # before it in this process (the integration suite shares tests out between processes).
        received = utc_now() - timedelta(days=40)
        ledger.submit([RequestInput(overdue, "erase", "gdpr", received),
                       RequestInput(soon, "access", "ccpa", received),
                       RequestInput(later, "access", "gdpr", utc_now())])
        urgency = {("erase", "gdpr"): "overdue", ("access", "ccpa"): "soon", ("access", "gdpr"): "later"}
        seeded = {urgency[s.request_type, s.regulation]: s.request_id for s in ledger.statuses()}
        for run in _runs():  # the run history a `dsr run` records, written the same way (Ledger.record_run)
            ledger.record_run(run)
        with served(config) as server:
            yield Site(server, settings, mailbox, seeded, [overdue, soon, later])
    finally:
        mailbox.stop()


def _browser(user_data: Path, *extra: str) -> WebDriver:
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--disable-background-networking", "--disable-component-update", "--disable-sync",
                     "--no-first-run", "--window-size=900,1000", f"--user-data-dir={user_data}", *extra):
        options.add_argument(argument)
    # the console (script errors, CSP refusals) and the network events (the headers the page sent)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    return webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)


@pytest.fixture(scope="module")
def driver(tmp_path_factory) -> Iterator[WebDriver]:
    browser = _browser(tmp_path_factory.mktemp("chromium"))
    try:
        yield browser
    finally:
        browser.quit()


# -- what a person sees ------------------------------------------------------------------------------
def wait(driver: WebDriver, until: Callable[[WebDriver], object], what: str, timeout: float = 15) -> object:
    return WebDriverWait(driver, timeout).until(until, f"waited {timeout} s for {what}")


def by_id(driver: WebDriver, element_id: str) -> WebElement:
    return driver.find_element(By.ID, element_id)


def visible_text(driver: WebDriver, element_id: str, timeout: float = 15) -> str:
    """The element's text once it is shown and not empty."""
    wait(driver, lambda d: by_id(d, element_id).is_displayed() and by_id(d, element_id).text.strip(),
         f"#{element_id} to show text", timeout)
    return by_id(driver, element_id).text


def shoot(driver: WebDriver, tmp_path: Path, name: str, width: int = 900, readme: bool = False) -> Path:
    """A screenshot of the whole page (`width` CSS pixels wide) into the test's tmp dir; the ones
    the docs show (`readme`) also into $DSR_SCREENSHOTS when that is set. Also checks the console stayed clean."""
    assert_clean_console(driver)
    metrics = {"width": width, "height": 600, "deviceScaleFactor": 1, "mobile": False}
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {**metrics, "height": min(height, 4000)})
    shot = tmp_path / f"{name}.png"
    try:
        assert driver.save_screenshot(str(shot)) and shot.stat().st_size > 10_000, f"screenshot {name} is empty"
    finally:
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    if readme and os.environ.get("DSR_SCREENSHOTS"):
        target = Path(os.environ["DSR_SCREENSHOTS"])
        target = target if target.is_absolute() else REPO / target
        target.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, target / f"{name}.png")
    return shot


def assert_clean_console(driver: WebDriver) -> None:
    """No script error and no content-security-policy refusal since the last look (the refusals the
    service answers with, 4xx, are logged as network entries and are expected)."""
    problems = [e["message"] for e in driver.get_log("browser") if e["source"] != "network"]
    assert not problems, problems


def fill_form(driver: WebDriver, site: Site, request_type: str, regulation: str, subject: str,
              email: str | None = None) -> None:
    driver.get(f"{site.server.url}/")
    driver.find_element(By.CSS_SELECTOR, f"input[name=type][value={request_type}]").click()
    driver.find_element(By.CSS_SELECTOR, f"input[name=regulation][value={regulation}]").click()
    by_id(driver, "subject_id").send_keys(subject)
    if email is not None:
        by_id(driver, "email").send_keys(email)


def landed(driver: WebDriver) -> tuple[str, str]:
    """On the status page after filing: the request id and status token from the URL fragment."""
    wait(driver, lambda d: "/status#" in d.current_url, "the status page")
    fragment = dict(p.split("=", 1) for p in driver.current_url.split("#", 1)[1].split("&"))
    visible_text(driver, "status")
    return fragment["id"], fragment["token"]


def filings_sent(driver: WebDriver) -> list[dict]:
    """The POSTs to /api/v1/requests the page sent since the last call, with their headers."""
    sent = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            request = message["params"]["request"]
            if request["method"] == "POST" and request["url"].endswith("/api/v1/requests"):
                sent.append(request)
    return sent


def in_ledger(site: Site, request_id: str, timeout: float = 20) -> dict:
    """The ledger's row of `request_id` once the service has moved it there (it does so every 0.5 s)."""
    ledger, deadline = Ledger(site.settings), time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = [r for r in ledger.requests() if r["request_id"] == request_id]
        if rows:
            assert len(rows) == 1, f"{request_id} is in the ledger {len(rows)} times"
            return rows[0]
        time.sleep(0.25)
    raise AssertionError(f"{request_id} did not reach the ledger within {timeout} s")


def _mailed(mailbox: Mailbox, request_id: str) -> list:
    """The e-mails sent for `request_id`, oldest first."""
    return [m for m in mailbox.messages if request_id in m["Subject"]]


# -- a person ----------------------------------------------------------------------------------------
def test_form_files_a_request_and_shows_its_status(site, driver, tmp_path):
    subject = site.subject("<b>&'\"")  # markup and quotes: sent as typed, never shown back
    fill_form(driver, site, "opt_out", "ccpa", subject)
    assert not by_id(driver, "email-group").is_displayed(), "an opt-out never asks for an e-mail address"
    assert "Global Privacy Control" in by_id(driver, "gpc-title").text
    assert not by_id(driver, "gpc-on").is_displayed(), "this browser sends no GPC signal"
    driver.get_log("performance")
    by_id(driver, "submit").click()
    request_id, _ = landed(driver)

    assert by_id(driver, "status").text == "received"
    assert "status-received" in by_id(driver, "status").get_attribute("class")
    due = by_id(driver, "due-date").text
    days_left = (date.fromisoformat(due) - utc_now().date()).days
    assert by_id(driver, "days-left").text == f"({days_left} days left)"
    assert by_id(driver, "type").text == "Do not sell or share my personal data"
    assert by_id(driver, "regulation").text == "CCPA (California)"
    assert by_id(driver, "request-id").text == request_id
    assert not by_id(driver, "verify").is_displayed(), "no code is asked for an opt-out"
    assert by_id(driver, "link").get_attribute("value") == driver.current_url
    assert by_id(driver, "keep").is_displayed() and by_id(driver, "copy").is_displayed()
    shoot(driver, tmp_path, "status-received")
    site.assert_no_subject(driver)

    (sent,) = filings_sent(driver)
    assert UUID.fullmatch(sent["headers"]["Idempotency-Key"])
    row = in_ledger(site, request_id)
    assert (row["subject_id"], row["request_type"], row["regulation"]) == (subject, "opt_out", "ccpa")
    # The deadline promised on the page is the ledger's (a CCPA opt-out: 15 business days), before and after.
    assert due == row["due_date"].isoformat()
    by_id(driver, "refresh").click()
    wait(driver, lambda d: by_id(d, "due-date").text == due, "the same due date from the ledger")


def test_status_page_refuses_a_wrong_or_missing_link(site, driver):
    driver.get(f"{site.server.url}/status#id={site.seeded['soon']}&token=not-the-token")
    assert "does not match" in visible_text(driver, "load-error")
    assert not by_id(driver, "request").is_displayed()
    driver.get(f"{site.server.url}/status")
    assert "needs the full link" in visible_text(driver, "load-error")
    assert not by_id(driver, "keep").is_displayed()


def test_verification_by_an_emailed_code(site, driver, tmp_path):
    subject = site.subject()
    fill_form(driver, site, "erase", "gdpr", subject)
    assert by_id(driver, "email-group").is_displayed()
    by_id(driver, "submit").click()
    # The service needs an address to verify an erase: its message shows beside the field, focused.
    assert visible_text(driver, "email-error") == "an e-mail address is needed to verify who is asking"
    assert by_id(driver, "email").get_attribute("aria-invalid") == "true"
    assert driver.switch_to.active_element == by_id(driver, "email")
    assert driver.current_url == f"{site.server.url}/"
    site.assert_no_subject(driver)
    shoot(driver, tmp_path, "form-needs-email")

    by_id(driver, "email").send_keys("person@example.org")
    by_id(driver, "submit").click()
    request_id, _ = landed(driver)
    assert by_id(driver, "status").text == "identity_unverified"
    assert "verification code" in visible_text(driver, "reason")
    assert by_id(driver, "verify").is_displayed() and by_id(driver, "code").is_displayed()
    assert not Ledger(site.settings).statuses(request_id=request_id), "an unverified request stays out of the ledger"
    first = site.mailbox.code_for(request_id)

    by_id(driver, "code").send_keys("12ab")  # checked in the page: costs no try
    by_id(driver, "verify-submit").click()
    assert visible_text(driver, "verify-error") == "The code is the six digits from the e-mail."
    by_id(driver, "code").clear()
    by_id(driver, "code").send_keys(f"{(int(first) + 1) % 10**6:06d}")
    by_id(driver, "verify-submit").click()
    wait(driver, lambda d: "wrong code" in d.find_element(By.ID, "verify-error").text, "the wrong-code message")
    assert by_id(driver, "verify-error").text == "wrong code; 4 tries left"  # the service's words
    assert by_id(driver, "code").get_attribute("aria-invalid") == "true"
    shoot(driver, tmp_path, "status-wrong-code")

    by_id(driver, "resend").click()
    assert "new code is on its way" in visible_text(driver, "verify-note")
    wait(driver, lambda _: len(_mailed(site.mailbox, request_id)) == 2, "the second e-mail")
    by_id(driver, "code").clear()
    by_id(driver, "code").send_keys(first)  # a new code replaces the old one
    by_id(driver, "verify-submit").click()
    wait(driver, lambda d: "wrong code; 3" in d.find_element(By.ID, "verify-error").text, "the old code refused")

    by_id(driver, "code").clear()
    by_id(driver, "code").send_keys(site.mailbox.code_for(request_id))
    by_id(driver, "verify-submit").click()
    assert "you are confirmed" in visible_text(driver, "verify-note")
    wait(driver, lambda d: d.find_element(By.ID, "status").text == "received", "status received")
    assert not by_id(driver, "verify-form").is_displayed()
    assert not by_id(driver, "reason").is_displayed()
    shoot(driver, tmp_path, "status", readme=True)
    site.assert_no_subject(driver)
    row = in_ledger(site, request_id)
    assert (row["subject_id"], row["request_type"], row["status"]) == (subject, "erase", "received")


def test_retry_after_a_network_error_reuses_the_idempotency_key(site, driver, tmp_path):
    fill_form(driver, site, "access", "gdpr", site.subject(prefix="example-customer-"), "someone@example.org")
    shoot(driver, tmp_path, "request-form", readme=True)
    driver.get_log("performance")
    offline = {"offline": True, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1}
    driver.execute_cdp_cmd("Network.enable", {})
    driver.execute_cdp_cmd("Network.emulateNetworkConditions", offline)
    by_id(driver, "submit").click()
    assert "could not be reached" in visible_text(driver, "form-error")
    assert "Sending again is safe" in by_id(driver, "form-error").text
    driver.execute_cdp_cmd("Network.emulateNetworkConditions", {**offline, "offline": False})
    by_id(driver, "submit").click()
    request_id, _ = landed(driver)
    # Filed again with other values: a new key (the old one would be refused as another request's).
    fill_form(driver, site, "opt_out", "ccpa", site.subject())
    by_id(driver, "submit").click()
    other_id, _ = landed(driver)

    keys = [r["headers"]["Idempotency-Key"] for r in filings_sent(driver)]
    assert len(keys) == 3 and keys[0] == keys[1] != keys[2] and all(UUID.fullmatch(k) for k in keys)
    assert request_id != other_id
    assert in_ledger(site, other_id)["request_type"] == "opt_out"


def test_gpc_signal_is_honoured(site, tmp_path):
    browser = _browser(tmp_path / "chromium", "--enable-features=GlobalPrivacyControl,GlobalPrivacyControlForce")
    try:
        fill_form(browser, site, "access", "gdpr", site.subject(), "gpc@example.org")
        assert "is sending the Global Privacy Control signal" in visible_text(browser, "gpc-on")
        by_id(browser, "submit").click()
        request_id, _ = landed(browser)
        opt_out = visible_text(browser, "gpc-id")
        assert opt_out != request_id and "opt-out of the sale and sharing" in by_id(browser, "gpc").text
        site.assert_no_subject(browser)
        assert_clean_console(browser)
    finally:
        browser.quit()
    row = in_ledger(site, opt_out)  # recorded at once: an opt-out is never verified
    assert (row["request_type"], row["regulation"]) == ("opt_out", "ccpa")


# -- an operator -------------------------------------------------------------------------------------
def test_dashboard(site, driver, tmp_path):
    driver.get(f"{site.server.url}/dashboard")
    by_id(driver, "token").send_keys("not-the-operator-token")
    driver.find_element(By.CSS_SELECTOR, "#token-form button[type=submit]").click()
    assert visible_text(driver, "token-error").startswith("Wrong token")
    assert by_id(driver, "token-form").is_displayed() and not by_id(driver, "board").is_displayed()
    assert driver.execute_script("return sessionStorage.length") == 0
    shoot(driver, tmp_path, "dashboard-wrong-token")

    by_id(driver, "token").send_keys(OPERATOR_TOKEN)
    driver.find_element(By.CSS_SELECTOR, "#token-form button[type=submit]").click()
    visible_text(driver, "loaded")
    assert not by_id(driver, "token-form").is_displayed() and not by_id(driver, "token-error").is_displayed()
    assert driver.execute_script("return [sessionStorage.getItem('dsr-operator-token'), localStorage.length]") \
        == [OPERATOR_TOKEN, 0]

    # Open requests, most urgent first, each with its urgency as a class, a colour and a word.
    truth = site.server.operator().get("/api/v1/operator/requests", params={"status": "open"}).json()["requests"]
    rows = driver.find_elements(By.CSS_SELECTOR, "#open-requests tbody tr")
    shown = [(r.find_element(By.TAG_NAME, "code").text, int(r.get_attribute("data-days-left"))) for r in rows]
    assert sorted(shown) == sorted((t["request_id"], t["days_left"]) for t in truth)
    assert [d for _, d in shown] == sorted(d for _, d in shown)
    assert by_id(driver, "open-count").text == f"({len(truth)})"
    words = {"urgency-overdue": "Overdue", "urgency-soon": "Due soon", "urgency-later": "Later"}
    colours = {}
    for row, (_, days) in zip(rows, shown, strict=True):
        level = "urgency-overdue" if days < 0 else "urgency-soon" if days <= 7 else "urgency-later"
        assert row.get_attribute("class") == level
        assert row.find_element(By.CLASS_NAME, "urgency-label").text == words[level]
        colours.setdefault(level, set()).add(row.value_of_css_property("background-color"))
    assert [r for r, _ in shown[:2]] == [site.seeded["overdue"], site.seeded["soon"]]
    assert len(colours) == 3 and all(len(c) == 1 for c in colours.values())
    assert len(set.union(*colours.values())) == 3, "each urgency has its own colour"
    legend = driver.find_elements(By.CSS_SELECTOR, "ul.legend[aria-label=Urgency] li")
    assert [li.text.split(":")[0] for li in legend] == ["Overdue", "Due soon", "Later"]
    assert [li.find_element(By.CLASS_NAME, "swatch").value_of_css_property("background-color") for li in legend] \
        == [colours[level].copy().pop() for level in words]

    # The last runs: one stacked bar per run, newest first, a segment per stage sized by its seconds.
    runs = _runs()[::-1]
    bars = driver.find_elements(By.CSS_SELECTOR, "#runs-chart svg g.bar-row")
    assert len(bars) == len(runs)
    stages = [li.text for li in driver.find_elements(By.CSS_SELECTOR, "#stage-legend li")]
    assert stages == ["ledger", "resolve", "erase", "purge", "verify", "export"]
    scale = None
    for bar, run in zip(bars, runs, strict=True):
        segments = bar.find_elements(By.TAG_NAME, "rect")
        assert [float(s.get_attribute("data-value")) for s in segments] == [run.seconds[s] for s in stages
                                                                           if s in run.seconds]
        for segment, stage in zip(segments, [s for s in stages if s in run.seconds], strict=True):
            assert f"stage-{stages.index(stage)}" in segment.get_attribute("class")
            width = float(segment.get_attribute("width")) / run.seconds[stage]
            scale = scale or width
            assert abs(width - scale) < 1e-6 * scale, "segment widths are proportional to seconds"
    stage_colours = {s.value_of_css_property("fill") for s in driver.find_elements(By.CSS_SELECTOR, "#runs-chart rect")}
    assert len(stage_colours) == len(stages)

    # Rows erased per table: bars and figures from the ledger's totals.
    totals = Ledger(site.settings).table_totals()
    assert [(t["table"], t["rows"]) for t in totals] == [("demo.events", 150), ("demo.users", 4)]
    cells = [[c.text for c in r.find_elements(By.TAG_NAME, "td")]
             for r in driver.find_elements(By.CSS_SELECTOR, "#table-totals tbody tr")]
    assert cells == [["demo.events", "150", "93.8 KB", "2"], ["demo.users", "4", "2.1 KB", "1"]]
    table_bars = driver.find_elements(By.CSS_SELECTOR, "#tables-chart rect")
    assert [float(b.get_attribute("data-value")) for b in table_bars] == [150, 4]
    assert float(table_bars[0].get_attribute("width")) > 30 * float(table_bars[1].get_attribute("width"))
    shoot(driver, tmp_path, "dashboard", width=1180, readme=True)
    site.assert_no_subject(driver)

    # A stale token is asked for again; "forget" clears it.
    driver.execute_script("sessionStorage.setItem('dsr-operator-token', 'stale')")
    by_id(driver, "reload").click()
    assert visible_text(driver, "token-error").startswith("Wrong token")
    assert driver.execute_script("return sessionStorage.length") == 0
    by_id(driver, "token").send_keys(OPERATOR_TOKEN)
    driver.find_element(By.CSS_SELECTOR, "#token-form button[type=submit]").click()
    visible_text(driver, "loaded")
    by_id(driver, "forget").click()
    assert by_id(driver, "token-form").is_displayed() and driver.execute_script("return sessionStorage.length") == 0
