"""The dashboards in a real headless Chromium against a real ``agentledger serve``.

One server for the module: a SQLite file seeded with ``agentledger demo seed --runs 80 --seed 5``,
served with its in-process worker, plus one long-running run started through the API so that
/leases has a live lease. Each page must load after login with no SEVERE console message (a 5xx
of any request shows up there too), show the facts of the seeded scenario (read back through the
JSON API), and react to its filters; the server log must stay free of tracebacks.

Set ``AGENTLEDGER_SCREENSHOTS=<dir>`` to also save a 1400x900 screenshot of each page there
(``docs/screenshots`` is made that way).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
import requests

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
WAIT = 25

pytestmark = pytest.mark.skipif(
    not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)),
    reason="needs Debian chromium and chromium-driver (.ci/run installs them)",
)

selenium = pytest.importorskip("selenium")
from selenium import webdriver  # noqa: E402
from selenium.common.exceptions import (  # noqa: E402
    StaleElementReferenceException,
    TimeoutException,
    WebDriverException,
)
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402
from support.processes import ProcessManager  # noqa: E402
from support.waiting import wait_until  # noqa: E402


@dataclass
class Served:
    base: str
    tokens: dict[str, str]
    log: Path

    def api(self, path: str, *, token: str = "admin", method: str = "GET", **kwargs):
        reply = requests.request(method, self.base + path, timeout=10,
                                 headers={"Authorization": f"Bearer {self.tokens[token]}",
                                          **kwargs.pop("headers", {})}, **kwargs)
        assert reply.status_code < 300, (path, reply.status_code, reply.text)
        return reply.json()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    work = tmp_path_factory.mktemp("browser")
    url = f"sqlite:///{work / 'ledger.db'}"
    secret = {"AGENTLEDGER_SECRET_KEY": "browser-tests"}
    with ProcessManager(work) as procs:
        env = procs.environment(url, **secret)
        done = procs.run(["demo", "seed", "--runs", "80", "--seed", "5"], env, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        tokens = {}
        for role in ("viewer", "user", "admin"):
            done = procs.run(["token", "create", "--owner", f"{role}-1", "--role", role], env)
            assert done.returncode == 0, done.stdout + done.stderr
            tokens[role] = done.stdout.strip().splitlines()[-1]
        server = procs.serve(url, worker=True, threads=None, **secret)
        try:
            yield Served(server.base_url or "", tokens, server.log_path)
        finally:
            server.stop(timeout=15)
        text = server.log()
    assert "Traceback" not in text, text[-4000:]


@pytest.fixture(scope="module")
def facts(served):
    """What the seeded scenario holds, read through the JSON API (not through the dashboards)."""
    runs = served.api("/api/agent-runs?limit=500")["items"]
    roots = Counter(r["root_run_id"] for r in runs)
    biggest, size = roots.most_common(1)[0]
    interrupted = [r for r in runs if r["status"] == "interrupted"]
    answered = next(r for r in runs if r["final_message_id"] and r["parent_run_id"] is None)
    answer = served.api(f"/api/messages/{answered['final_message_id']}/provenance")
    agents = served.api("/api/agents")["items"]
    # A run that keeps its lease while the tests look at /leases.
    served.api("/api/agents", method="POST", json={
        "id": "slow-bot", "name": "Slow Bot", "kind": "scripted",
        "params": {"steps": [{"say": "thinking about {input}"}, {"sleep": 600}]}})
    chat = served.api("/api/sessions", method="POST", json={"agent_id": "slow-bot"})
    slow = served.api(f"/api/sessions/{chat['id']}/messages", method="POST",
                      json={"content": "take your time"}, headers={"Idempotency-Key": "slow-1"})
    wait_until(lambda: served.api(f"/api/agent-runs/{slow['run_id']}")["status"] == "running",
               timeout=60, interval=0.2, message="the in-process worker to claim the slow run")
    return {"tree_root": biggest, "tree_size": size, "interrupted": interrupted,
            "answer": answer, "agents": agents, "slow_run": slow["run_id"]}


@pytest.fixture(scope="module")
def browser(served):
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="agentledger-chromium-")
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--no-first-run", f"--user-data-dir={profile}", "--window-size=1400,900"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        # A 1400x900 viewport (the window's own frame takes some of its outer size).
        driver.set_window_size(1400, 900)
        inner_w, inner_h = driver.execute_script("return [window.innerWidth, window.innerHeight]")
        driver.set_window_size(1400 + 1400 - inner_w, 900 + 900 - inner_h)
        driver.get(f"{served.base}/login?token={served.tokens['viewer']}")
        WebDriverWait(driver, WAIT).until(lambda d: "agentledger" in d.title)
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def body_text(driver) -> str:
    try:
        return driver.find_element(By.TAG_NAME, "body").text
    except WebDriverException:
        return ""


def wait_for_text(driver, *needles: str, timeout: float = WAIT) -> str:
    WebDriverWait(driver, timeout).until(lambda d: all(n in body_text(d) for n in needles))
    return body_text(driver)


def wait_idle(driver) -> None:
    """Until no Dash callback is in flight (the renderer marks the document while one is)."""
    WebDriverWait(driver, WAIT).until(lambda d: d.execute_script(
        "return !document.querySelector('[data-dash-is-loading=\"true\"]')"))


def severe_messages(driver) -> list[str]:
    return [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def open_page(driver, served, path: str) -> None:
    driver.get_log("browser")  # drop what earlier pages logged
    driver.get(served.base + path)
    WebDriverWait(driver, WAIT).until(lambda d: d.find_elements(By.ID, "_pages_content"))


def finish_page(driver, name: str) -> None:
    wait_idle(driver)
    assert severe_messages(driver) == []
    target = os.environ.get("AGENTLEDGER_SCREENSHOTS")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        time.sleep(0.8)  # let charts finish their transitions
        driver.save_screenshot(str(Path(target) / f"{name}.png"))


def grid_column(driver, grid_id: str, column: str) -> list[str]:
    # The grid may re-render its rows between the look-up and the read (a filter's new rows
    # arriving): the cells found are then gone, and the column is read again.
    for _attempt in range(20):
        cells = driver.find_elements(By.CSS_SELECTOR, f"#{grid_id} .ag-center-cols-container "
                                                      f"[col-id='{column}']")
        try:
            return [c.text for c in cells]
        except StaleElementReferenceException:
            continue
    raise AssertionError(f"the {grid_id} grid kept re-rendering while its {column} column "
                         "was read")


def json_link(driver, prefix: str, *needles: str) -> str:
    """The page's "JSON" link once its callback has put the page's filters in it."""
    link = driver.find_element(By.ID, f"{prefix}-json")
    WebDriverWait(driver, WAIT).until(
        lambda d: all(n in (link.get_attribute("href") or "") for n in needles))
    return link.get_attribute("href")


def follow_json_link(driver, prefix: str, *needles: str) -> tuple[dict, dict]:
    """Click the page's "JSON" link as a person would (the login cookie is the credential) and
    read what it returns; also its query string, parsed."""
    href = json_link(driver, prefix, *needles)
    driver.find_element(By.ID, f"{prefix}-json").click()
    WebDriverWait(driver, WAIT).until(
        lambda d: urlsplit(d.current_url).path == urlsplit(href).path)
    shown = driver.find_elements(By.TAG_NAME, "pre")
    return json.loads(shown[0].text if shown else body_text(driver)), parse_qs(urlsplit(href).query)


# --- access ----------------------------------------------------------------------------------


def test_anonymous_browsers_are_sent_to_login(served):
    reply = requests.get(served.base + "/interrupted?window=30d", allow_redirects=False, timeout=10)
    assert reply.status_code == 303
    assert reply.headers["Location"] == "/login?next=/interrupted%3Fwindow%3D30d"


def test_a_callback_without_login_is_refused(served):
    body = {"output": "run-node.children", "outputs": {"id": "run-node", "property": "children"},
            "inputs": [{"id": "run-tree", "property": "tapNodeData", "value": None},
                       {"id": "run-id", "property": "data", "value": "run_x"}],
            "changedPropIds": ["run-id.data"], "state": []}
    reply = requests.post(served.base + "/_dash-update-component", json=body, timeout=10)
    assert reply.status_code == 401
    assert reply.json()["error"]["code"] == "unauthenticated"
    for path in ("/_dash-layout", "/_dash-dependencies"):
        assert requests.get(served.base + path, timeout=10).status_code == 401


def test_a_user_token_gets_403(served):
    with requests.Session() as http:
        login = http.get(f"{served.base}/login?token={served.tokens['user']}", timeout=10,
                         allow_redirects=False)
        assert login.status_code == 303  # the token is valid: the user is logged in
        assert http.get(served.base + "/", timeout=10).status_code == 403
        assert http.get(served.base + "/agents", timeout=10).status_code == 403
        refused = http.post(served.base + "/_dash-update-component", json={}, timeout=10)
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden"


# --- pages ---------------------------------------------------------------------------------------


def test_overview(browser, served, facts):
    open_page(browser, served, "/?window=30d")
    text = wait_for_text(browser, "Runs created", "Recent interruptions", "Queued and running now")
    assert json_link(browser, "overview", "?").endswith("/api/overview?window=30d")
    assert facts["slow_run"] in text  # the run that is running now
    assert browser.find_elements(By.CSS_SELECTOR, "#overview-status-chart .bars path")
    latest = max(facts["interrupted"], key=lambda r: r["finished_at"])
    assert latest["id"] in text
    finish_page(browser, "overview")


def test_messages_search_filter_updates_the_page_and_the_url(browser, served, facts):
    open_page(browser, served, "/messages")
    wait_for_text(browser, "rows 1–50")
    box = browser.find_element(By.ID, "messages-q")
    box.send_keys("refund", Keys.ENTER)
    WebDriverWait(browser, WAIT).until(lambda d: "q=refund" in d.current_url)
    wait_idle(browser)
    answers = grid_column(browser, "messages-grid", "content_preview")
    assert answers and all("refund" in a.lower() for a in answers)
    finish_page(browser, "messages")
    # The JSON link is the same search: followed, it returns these answers.
    twin, query = follow_json_link(browser, "messages", "q=refund")
    assert query == {"q": ["refund"], "window": ["all"], "limit": ["50"]}
    assert [i["content_preview"] + ("…" if i["content_truncated"] else "")
            for i in twin["items"]] == answers
    # The URL is a shareable link: opening it restores the filter and the same rows.
    open_page(browser, served, "/messages?q=refund")
    wait_idle(browser)
    assert browser.find_element(By.ID, "messages-q").get_attribute("value") == "refund"
    assert grid_column(browser, "messages-grid", "content_preview") == answers


def test_message_provenance(browser, served, facts):
    answer = facts["answer"]
    open_page(browser, served, f"/messages/{answer['message']['id']}")
    text = wait_for_text(browser, "Produced by", "Agent execution snapshot", "Context pack snapshot")
    assert answer["message"]["content"] in text
    assert f"{answer['agent']['name']} version {answer['agent']['version']}" in text
    assert answer["run"]["id"] in text and "open the whole tree" in text
    assert "run.completed" in text
    finish_page(browser, "message")


def test_runs_status_filter(browser, served, facts):
    open_page(browser, served, "/runs?window=30d")
    wait_for_text(browser, "rows 1–50")
    Select(browser.find_element(By.ID, "runs-status")).select_by_value("failed")
    WebDriverWait(browser, WAIT).until(lambda d: "status=failed" in d.current_url)
    wait_idle(browser)
    WebDriverWait(browser, WAIT).until(
        lambda d: set(grid_column(d, "runs-grid", "status")) == {"failed"})
    finish_page(browser, "runs")
    runs = grid_column(browser, "runs-grid", "run")
    twin, query = follow_json_link(browser, "runs", "status=failed")
    assert set(query) == {"status", "created_after", "limit"}  # GET /api/agent-runs: no presets
    assert [i["id"] for i in twin["items"]] == runs


def test_a_link_on_an_agent_keeps_its_filter_and_typing_finds_an_agent(browser, served, facts):
    # (the drop-down used to drop an agent missing from its options, and the page showed all)
    open_page(browser, served, "/runs?agent=no-such-agent&window=30d")
    wait_for_text(browser, "No runs match", "no-such-agent (no such agent)")
    wait_idle(browser)
    assert "agent=no-such-agent" in browser.current_url
    twin, query = follow_json_link(browser, "runs", "agent_id=no-such-agent")
    assert twin["items"] == [] and query["agent_id"] == ["no-such-agent"]
    open_page(browser, served, "/runs?window=30d")
    wait_for_text(browser, "rows 1–")
    agent = facts["agents"][-1]
    browser.find_element(By.CSS_SELECTOR, "#runs-agent input").send_keys(agent["name"].upper())
    wait_for_text(browser, f"{agent['name']} ({agent['id']})")
    browser.find_element(By.CSS_SELECTOR, "#runs-agent input").send_keys(Keys.ENTER)
    WebDriverWait(browser, WAIT).until(lambda d: f"agent={agent['id']}" in d.current_url)
    wait_idle(browser)
    finish_page(browser, "runs-agent-filter")


def test_a_page_whose_login_ended_goes_to_the_login_form_and_back(browser, served, facts):
    # (it kept showing its last rows under a filter just changed, and only logged the 401)
    open_page(browser, served, "/runs?window=30d")
    wait_for_text(browser, "rows 1–50")
    wait_idle(browser)
    browser.delete_cookie("agentledger_session")  # as a logout in another tab does
    try:
        Select(browser.find_element(By.ID, "runs-status")).select_by_value("failed")
        WebDriverWait(browser, WAIT).until(lambda d: urlsplit(d.current_url).path == "/login")
        assert parse_qs(urlsplit(browser.current_url).query)["next"] == ["/runs?window=30d"]
        wait_for_text(browser, "Paste an API token")
        field = browser.find_element(By.CSS_SELECTOR, "input[name='token']")
        field.send_keys(served.tokens["viewer"], Keys.ENTER)
        WebDriverWait(browser, WAIT).until(lambda d: urlsplit(d.current_url).path == "/runs")
        wait_for_text(browser, "rows 1–50")
    finally:
        browser.get(f"{served.base}/login?token={served.tokens['viewer']}")


def test_run_tree(browser, served, facts):
    root = facts["tree_root"]
    open_page(browser, served, f"/runs/{root}")
    wait_for_text(browser, f"{facts['tree_size']} runs in this tree")
    WebDriverWait(browser, WAIT).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#run-tree canvas"))
    wait_for_text(browser, "run.queued")  # the opened run's events
    # Click a child node on the canvas: its events and snapshots replace the root's.
    tree = served.api(f"/api/agent-runs/{root}/tree")
    child = tree["nodes"][-1]["run_id"]
    finder = ("const el = [...document.querySelectorAll('#run-tree, #run-tree *')]"
              ".find(e => e._cyreg && e._cyreg.cy); return el;")
    container = WebDriverWait(browser, WAIT).until(lambda d: d.execute_script(finder))
    where = ("const el = arguments[0]; const n = el._cyreg.cy.getElementById(arguments[1]);"
             "const p = n.renderedPosition(); return [p.x, p.y, el.clientWidth, el.clientHeight];")

    def settled():
        """The node's rendered position and the container's size, once two reads a quarter
        second apart agree (the layout, a re-fit or a resize may still move it)."""
        seen = []

        def same_twice(d):
            now = [round(v, 1) for v in d.execute_script(where, container, child)]
            again = seen[-1:] == [now]
            seen.append(now)
            return now if again else None

        return WebDriverWait(browser, WAIT, poll_frequency=0.25).until(same_twice)

    def click_child() -> bool:
        """Click where the node is now; True once the page shows it selected. A click that a
        late re-fit made miss (or land on another node) is made again where the node went."""
        x, y, width, height = settled()
        ActionChains(browser).move_to_element_with_offset(
            container, int(x - width / 2), int(y - height / 2)).click().perform()
        try:
            WebDriverWait(browser, 5).until(
                lambda d: d.find_element(By.ID, "run-selected").text == child)
        except TimeoutException:
            return False
        return True

    wait_until(click_child, timeout=4 * WAIT, interval=0,
               message=lambda: f"run-selected to show {child} after clicking its node "
                               f"(it shows {browser.find_element(By.ID, 'run-selected').text!r})")
    assert "Agent snapshot" in body_text(browser)
    finish_page(browser, "run_tree")


def test_timeline(browser, served, facts):
    open_page(browser, served, "/timeline?window=30d&limit=50")
    # The caption and the chart are separate outputs: wait for both before reading the page.
    text = wait_for_text(browser, "Showing the 50 most recent of", "ran → succeeded")
    assert "ran → succeeded" in text
    assert len(browser.find_elements(By.CSS_SELECTOR, "#timeline-chart .bars path")) >= 50
    Select(browser.find_element(By.ID, "timeline-status")).select_by_value("interrupted")
    WebDriverWait(browser, WAIT).until(lambda d: "status=interrupted" in d.current_url)
    wait_for_text(browser, f"{len(facts['interrupted'])} runs created in")
    href = json_link(browser, "timeline", "status=interrupted")
    assert href.endswith("/api/timeline?status=interrupted&window=30d&limit=50")
    Select(browser.find_element(By.ID, "timeline-status")).select_by_value("any")
    wait_for_text(browser, "Showing the 50 most recent of")
    finish_page(browser, "timeline")


def test_interrupted(browser, served, facts):
    open_page(browser, served, "/interrupted?window=30d")
    text = wait_for_text(browser, "Interrupted per day, by reason", "lease_expired")
    for run in facts["interrupted"]:
        assert run["id"] in text
    Select(browser.find_element(By.ID, "interrupted-reason")).select_by_value("parent_terminal")
    WebDriverWait(browser, WAIT).until(lambda d: "reason=parent_terminal" in d.current_url)
    WebDriverWait(browser, WAIT).until(
        lambda d: set(grid_column(d, "interrupted-grid", "reason")) == {"parent_terminal"})
    finish_page(browser, "interrupted")
    runs = grid_column(browser, "interrupted-grid", "run")
    twin, query = follow_json_link(browser, "interrupted", "reason=parent_terminal")
    assert query == {"reason": ["parent_terminal"], "window": ["30d"], "limit": ["50"]}
    assert [i["run_id"] for i in twin["items"]] == runs
    assert sum(twin["trend"]["by_reason"].values()) == len(runs) == len(
        [r for r in facts["interrupted"] if r["id"] in runs])


def test_leases_refresh_and_highlight_leases_about_to_expire(browser, served, facts):
    open_page(browser, served, "/leases?risk=45")
    text = wait_for_text(browser, facts["slow_run"], "database clock")
    assert "serve-" in text  # the in-process executor is a live executor
    clock = browser.find_element(By.ID, "leases-clock").text
    WebDriverWait(browser, 10).until(lambda d: d.find_element(By.ID, "leases-clock").text != clock)
    row = browser.find_element(By.CSS_SELECTOR, "#leases-leases .ag-center-cols-container .ag-row")
    assert "rgb(248, 215, 218)" in row.get_attribute("style")  # at risk: under 45 s left
    finish_page(browser, "leases")
    assert json_link(browser, "leases", "?").endswith(
        "/api/leases?seen_minutes=15&at_risk_seconds=45&limit=200")


def test_agents_compares_two_versions(browser, served, facts):
    open_page(browser, served, "/agents?window=30d&agent=support-bot&a=1&b=3")
    names = {a["name"] for a in facts["agents"]} - {"Slow Bot"}
    text = wait_for_text(browser, "support-bot: v1 and v3 side by side",
                         "What changed in the definition")
    for name in names:
        assert name in text
    assert "Support Bot Pro" in text and "gpt-4.1" in text
    # Each terminal status: its count (as the JSON twin, from the page's JSON link, counts it)
    # beside its rate.
    href = json_link(browser, "agents", "window=30d")
    assert href.endswith("/api/agent-outcomes?window=30d&limit=500")
    twin = [i for i in served.api(href.removeprefix(served.base))["items"]
            if i["version"] is None]
    for status in ("succeeded", "failed", "interrupted", "cancelled"):
        assert sorted(grid_column(browser, "agents-all", f"{status}_count")) == sorted(
            str(i["by_status"][status]) for i in twin)
    assert set(grid_column(browser, "agents-all", "succeeded")) <= {
        f"{i['rates']['succeeded'] * 100:.1f}%" if i["finished"] else "–" for i in twin}
    finish_page(browser, "agents")


def test_audit_lists_the_admin_actions_its_json_link_returns(browser, served, facts):
    open_page(browser, served, "/audit?action=agent.registered")
    WebDriverWait(browser, WAIT).until(
        lambda d: set(grid_column(d, "audit-grid", "action")) == {"agent.registered"})
    finish_page(browser, "audit")
    targets = grid_column(browser, "audit-grid", "target")
    assert "agent slow-bot" in targets
    twin, query = follow_json_link(browser, "audit", "action=agent.registered")
    assert query == {"action": ["agent.registered"], "limit": ["50"]}
    assert [f"{i['target_type']} {i['target_id']}" for i in twin["items"]] == targets


def _open_the_last_events(browser, served, log: str, path: str, total: int) -> None:
    """Open ``path``, check its event log opens on seqs 1–200 of ``total``, click "Last »"."""
    open_page(browser, served, path)
    label = f"[id*='event-log-label'][id*='\"{log}\"']"
    # The log is drawn inside another callback's output, which may draw it again meanwhile.
    wait = WebDriverWait(browser, WAIT, ignored_exceptions=(StaleElementReferenceException,))
    wait.until(lambda d: d.find_element(By.CSS_SELECTOR, label).text
               == f"Showing seq 1–200 of {total} events")
    assert "run.completed" not in body_text(browser)
    last = browser.find_element(By.CSS_SELECTOR, f"[id*='event-log-last'][id*='\"{log}\"']")
    # Bootstrap scrolls smoothly: jump, so the click lands where the button is.
    browser.execute_script("arguments[0].scrollIntoView({block: 'center', behavior: 'instant'})",
                           last)
    last.click()
    start = (total - 1) // 200 * 200
    wait.until(lambda d: d.find_element(By.CSS_SELECTOR, label).text
               == f"Showing seq {start + 1}–{total} of {total} events")
    text = wait_for_text(browser, "run.completed")
    assert "run.queued" not in text
    assert not last.is_enabled()
    finish_page(browser, f"{log}_last_events")


def test_a_long_runs_event_log_reaches_its_terminal_event_in_one_click(browser, served, facts):
    """A run with more events than a page: the provenance page and the run tree open on the
    first page, say which seqs they show of how many, and "Last »" shows run.completed."""
    served.api("/api/agents", method="POST", json={
        "id": "chatty-bot", "name": "Chatty Bot", "kind": "scripted",
        "params": {"steps": [{"say": f"word {n} "} for n in range(447)]}})
    chat = served.api("/api/sessions", method="POST", json={"agent_id": "chatty-bot"})
    posted = served.api(f"/api/sessions/{chat['id']}/messages", method="POST",
                        json={"content": "say a lot"}, headers={"Idempotency-Key": "chatty-1"})
    run_id = posted["run_id"]
    wait_until(lambda: served.api(f"/api/agent-runs/{run_id}")["status"] == "succeeded",
               timeout=120, interval=0.3, message="the chatty run to finish")
    run = served.api(f"/api/agent-runs/{run_id}")
    assert run["last_event_seq"] > 400  # three pages
    _open_the_last_events(browser, served, "message", f"/messages/{run['final_message_id']}",
                          run["last_event_seq"])
    _open_the_last_events(browser, served, "run", f"/runs/{run_id}", run["last_event_seq"])
