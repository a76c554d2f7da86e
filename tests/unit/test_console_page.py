"""The console page (roles/monitoring/files/ddpfleet.html) renders labels and values as text.

Prometheus' answers are data: a target label that holds markup must come out as text, never as
elements. The page runs in headless Chromium from a local copy whose ``fetch`` is stubbed with
answers of Prometheus' API shape (no Prometheus, no network). CI installs Chromium
(tools/browser-deps.sh, .ci/run); the test needs it.
"""

from __future__ import annotations

import html
import json
import shutil
import subprocess
from pathlib import Path

from time_bounds import within

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "roles" / "monitoring" / "files" / "ddpfleet.html"
MARKUP = '<b id="injected">node1</b><img src=x onerror="document.title=1">'

# Answers by query: the page asks for `up`, each host's step and heartbeat age, the run's start,
# then each host's img/s and the loss over time. Every host label is MARKUP.
STUB = """<script>
"use strict";
const HOST = %s;
window.fetch = async (url) => {
  const q = new URLSearchParams(url.split("?")[1]).get("query");
  const now = Date.now() / 1000;
  const one = v => [{metric: {host: HOST, run_id: "r1"}, value: [now, v]}];
  let result = [];
  if (q.startsWith("up")) result = one("1");
  else if (q.includes("ddpfleet_rank_step")) result = one("12");
  else if (q.includes("heartbeat_age")) result = one("0.5");
  else if (q.includes("attempt_start_time"))
    result = [{metric: {}, value: [now, String(now - 120)]}];
  else if (q.includes("images_per_second"))
    result = [{metric: {host: HOST}, values: [[now - 60, "10"], [now - 30, "11"]]}];
  else if (q.includes("run_loss")) result = [{metric: {}, values: [[now - 60, "2.5"]]}];
  return {statusText: "OK", json: async () => ({status: "success", data: {result: result}})};
};
</script>
"""


def render(tmp_path: Path) -> str:
    """The page's DOM after its first refresh, as Chromium serialises it."""
    chromium = shutil.which("chromium")
    assert chromium, "the console page test needs chromium (apt-get install chromium)"
    source = PAGE.read_text()
    page = tmp_path / "ddpfleet.html"
    page.write_text(source.replace("<script>", STUB % json.dumps(MARKUP) + "<script>", 1))
    done = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000",
         f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", page.as_uri() + "?run_id=r1"],
        capture_output=True, text=True, timeout=within(60), check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_a_label_holding_markup_is_shown_as_text(tmp_path: Path) -> None:
    dom = render(tmp_path)
    assert "updated " in dom, dom[-3000:]  # the refresh ran to its end, not "error: ..."
    table = dom[dom.index('id="hosts"') : dom.index('id="rate"')]
    assert f"<td>{html.escape(MARKUP, quote=False)}</td>" in table, table
    legend = dom[dom.index('id="rate"') : dom.index('id="loss"')]
    assert html.escape(MARKUP, quote=False) in legend, legend
    drawn = dom[dom.index('id="title"') : dom.index('id="loss"')]  # the page, not the stub
    assert "<b " not in drawn
    assert "<img" not in drawn
