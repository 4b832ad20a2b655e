// The only script the page runs (the Content Security Policy allows no other): it polls a session's console
// and egress log and shows them as text (textContent: never markup), and says what each choice will do.
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

// What a choice does, said beside it: a file's badges (on its card and in the list at the top) follow its
// apply / leave choice; a held group's checkbox takes or leaves every file listed under it, and shows whether
// all, some or none of them are taken. (Without this script the server reads the same fields.)
function said(n, value) {
  const which = value === "apply" ? "apply" : "skip";
  document.querySelectorAll('.badge.outcome[data-for="' + n + '"]').forEach(function (badge) {
    badge.textContent = badge.dataset[which];
    badge.className = "badge outcome " + badge.dataset[which + "Class"];
  });
}

function settled(file, value) {
  said(file.id.slice("file-".length), value);
  const group = file.closest("section.group");
  if (group) follow(group);
}

function chose(file, value) {
  const radio = file.querySelector("input[type=radio][value=" + value + "]");
  if (radio) radio.checked = true;
  settled(file, value);
}

function follow(group) {
  const box = group.querySelector(".take-all input");
  const files = group.querySelectorAll("section.file").length;
  const taken = group.querySelectorAll("section.file input[type=radio][value=apply]:checked").length;
  box.checked = taken === files;
  box.indeterminate = taken > 0 && taken < files;
}

document.querySelectorAll("section.file").forEach(function (file) {
  file.querySelectorAll("input[type=radio]").forEach(function (radio) {
    radio.addEventListener("change", function () {
      settled(file, radio.value);
    });
  });
});

document.querySelectorAll("section.group").forEach(function (group) {
  const box = group.querySelector(".take-all input");
  box.addEventListener("change", function () {
    const value = box.checked ? "apply" : "skip";
    group.querySelectorAll("section.file").forEach(function (file) {
      chose(file, value);
    });
  });
});

// An edited merge is a choice to apply it: its file's "apply" is selected (the person may still undo that).
document.querySelectorAll("textarea.merge").forEach(function (area) {
  area.addEventListener("input", function () {
    chose(area.closest("section.file"), "apply");
  });
});

// A step's "take all it made" / "leave all it made" (the timeline above the form): ticks or unticks the hunks the
// step made on this page and chooses their files — a held file (of a held group, or one the server marked
// data-held: a conflict, an unsafe change, anything views.holds names) is never taken so, only left. It changes
// the person's ticks and nothing else: the form is sent only by its own button. Step ids are compared as words,
// never put into a selector.
function madeBy(element, step) {
  return (element.dataset.steps || "").split(" ").indexOf(step) >= 0;
}

function byStep(step, take) {
  document.querySelectorAll("form#review section.file").forEach(function (file) {
    const held = file.closest("section.group") !== null || file.hasAttribute("data-held");
    if (take && held) return;
    const hunks = Array.prototype.filter.call(file.querySelectorAll(".hunk"), function (hunk) {
      return madeBy(hunk, step);
    });
    if (hunks.length) {
      hunks.forEach(function (hunk) {
        const box = hunk.querySelector("input[type=checkbox]");
        if (box) box.checked = take;
      });
      if (take) chose(file, "apply");
      else if (!file.querySelector(".hunk input[type=checkbox]:checked")) chose(file, "skip");
    } else if (!file.querySelector(".hunk") && madeBy(file, step)) {
      chose(file, take ? "apply" : "skip");
    }
  });
}

document.querySelectorAll("button.step-choice").forEach(function (button) {
  button.addEventListener("click", function () {
    byStep(button.dataset.step, button.dataset.choice === "take");
  });
});
