// The console's few behaviours, here instead of inline handlers so that the Content-Security-Policy
// allows scripts from this site only (no 'unsafe-inline', no 'unsafe-eval'; app/web/limits.py).
(function () {
  "use strict";
  // htmx's own settings (no inline <style>, no eval) are in templates/base.html's htmx-config meta tag.

  // <select data-autosubmit>: a filter that applies as soon as it changes.
  document.addEventListener("change", function (event) {
    const target = event.target;
    if (target.matches && target.matches("[data-autosubmit]") && target.form) {
      target.form.requestSubmit();
    }
  });

  // <form data-no-submit>: controls that act in place (charts); Enter must not reload the page.
  document.addEventListener("submit", function (event) {
    if (event.target.hasAttribute && event.target.hasAttribute("data-no-submit")) event.preventDefault();
  });

  // <form data-confirm="question">: ask before submitting.
  document.addEventListener("submit", function (event) {
    const form = event.target;
    const question = form.getAttribute && form.getAttribute("data-confirm");
    if (question && !window.confirm(question)) {
      event.preventDefault();
      event.stopImmediatePropagation();
    }
  }, true);

  // The Submit dialog: choosing a priority class sets the Preemptible box to that class's default
  // (docs/preemption.md); the user may still change it, and the preview shows what was asked.
  const PREEMPTIBLE_BY_DEFAULT = { scavenger: true, low: true, normal: true, high: false, urgent: false };
  document.addEventListener("change", function (event) {
    if (event.target.id !== "priority") return;
    const box = document.querySelector("[data-preemptible-default]");
    const value = event.target.value.trim();
    if (box && value in PREEMPTIBLE_BY_DEFAULT) box.checked = PREEMPTIBLE_BY_DEFAULT[value];
  });

  // <form data-clears="ID">: editing the form empties element ID (a stale preview).
  function clearStale(event) {
    const form = event.target.closest && event.target.closest("[data-clears]");
    if (form) {
      const stale = document.getElementById(form.getAttribute("data-clears"));
      if (stale) stale.innerHTML = "";
    }
  }
  document.addEventListener("input", clearStale);
  document.addEventListener("change", clearStale);

  // <div data-error-target="ID">: an htmx error answer inside it shows its heading in element ID.
  document.addEventListener("htmx:responseError", function (event) {
    const box = event.target.closest && event.target.closest("[data-error-target]");
    if (!box) return;
    const xhr = event.detail.xhr;
    const doc = new DOMParser().parseFromString(xhr.responseText, "text/html");
    const heading = doc.querySelector("h1");
    const target = document.getElementById(box.getAttribute("data-error-target"));
    if (target) target.textContent = heading ? heading.textContent : "HTTP " + xhr.status;
  });
})();
