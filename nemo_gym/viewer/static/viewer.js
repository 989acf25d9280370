// gym view: live-follow, the raw-JSON toggle and client-side table sorting. Every string from the server goes in
// through textContent or as server-rendered (escaped) HTML: nothing here builds markup from rollout text.
"use strict";

const POLL_MS = 1000;

async function follow() {
  // Pages marked live re-render their <main> when the runs gain rows (a `gym eval run` still writing).
  let busy = false;
  setInterval(async () => {
    if (busy) return;
    busy = true;
    try {
      const status = await (await fetch("/status.json", { cache: "no-store" })).json();
      const live = document.getElementById("live");
      if (live) live.textContent = status.indexing ? "indexing…" : "live";
      if (status.version !== document.body.dataset.version && document.body.dataset.live === "1") {
        const page = await fetch(location.href, { cache: "no-store" });
        const doc = new DOMParser().parseFromString(await page.text(), "text/html");
        const fresh = doc.getElementById("main");
        if (fresh) {
          document.getElementById("main").replaceWith(fresh);
          document.body.dataset.version = doc.body.dataset.version;
          wire();
        }
      }
    } catch (e) {
      const live = document.getElementById("live");
      if (live) live.textContent = "disconnected";
    } finally {
      busy = false;
    }
  }, POLL_MS);
}

function wireRaw() {
  for (const button of document.querySelectorAll("[data-raw]")) {
    button.addEventListener("click", async () => {
      const target = document.getElementById(button.dataset.target);
      if (!target.hidden) {
        target.hidden = true;
        button.textContent = "show raw JSON";
        return;
      }
      if (!target.dataset.loaded) {
        target.textContent = await (await fetch(button.dataset.raw)).text();
        target.dataset.loaded = "1";
      }
      target.hidden = false;
      button.textContent = "hide raw JSON";
    });
  }
}

function wireSort() {
  for (const table of document.querySelectorAll("table.sortable")) {
    table.querySelectorAll("th[data-sort]").forEach((th, column) => {
      th.addEventListener("click", () => {
        const body = table.tBodies[0];
        const descending = th.dataset.dir !== "desc";
        th.dataset.dir = descending ? "desc" : "asc";
        const cell = (row) => row.cells[column];
        const key = (row) =>
          th.dataset.sort === "num" ? parseFloat(cell(row).dataset.value ?? cell(row).textContent) : cell(row).textContent;
        const rows = Array.from(body.rows).sort((a, b) => {
          const x = key(a), y = key(b);
          return (x < y ? -1 : x > y ? 1 : 0) * (descending ? -1 : 1);
        });
        rows.forEach((row) => body.appendChild(row));
      });
    });
  }
}

function wire() {
  wireRaw();
  wireSort();
}

document.addEventListener("DOMContentLoaded", () => {
  wire();
  follow();
});
