// The only script the page runs (the Content Security Policy allows no other): it polls a session's console
// and egress log and shows them as text (textContent: never markup).
"use strict";
(function () {
  const live = document.querySelector("section.live");
  if (!live) return;
  const base = "/s/" + encodeURIComponent(live.dataset.session) + "/log/";
  const consoleBox = document.getElementById("console");
  const egress = document.querySelector("#egress tbody");
  async function poll() {
    try {
      const c = await (await fetch(base + "console", { credentials: "same-origin" })).json();
      if (c.lines) consoleBox.textContent = c.lines.join("\n");
      const p = await (await fetch(base + "proxy", { credentials: "same-origin" })).json();
      if (p.events) {
        egress.replaceChildren();
        for (const e of p.events.slice().reverse()) {
          const tr = document.createElement("tr");
          tr.className = e.decision;
          for (const k of ["time", "decision", "method", "target", "reason"]) {
            const td = document.createElement("td");
            td.textContent = e[k];
            tr.appendChild(td);
          }
          egress.appendChild(tr);
        }
      }
    } catch (err) {
      consoleBox.dataset.error = String(err);
    }
  }
  poll();
  setInterval(poll, 3000);
})();

// An edited merge is a choice to apply it: its file's "apply" is selected (the person may still undo that).
document.querySelectorAll("textarea.merge").forEach(function (area) {
  area.addEventListener("input", function () {
    const apply = area.closest("section.file").querySelector("input[type=radio][value=apply]");
    if (apply) apply.checked = true;
  });
});
