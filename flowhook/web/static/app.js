// Small progressive enhancements; every page works without them.
(() => {
  // Confirm before destructive actions.
  document.addEventListener("click", (event) => {
    const button = event.target.closest("[data-confirm]");
    if (button && !window.confirm(button.dataset.confirm)) event.preventDefault();
  });

  // Copy a secret to the clipboard.
  document.addEventListener("click", async (event) => {
    const button = event.target.closest("[data-copy]");
    if (!button) return;
    const source = document.querySelector(button.dataset.copy);
    try {
      await navigator.clipboard.writeText(source.textContent.trim());
      button.textContent = "Copied";
    } catch {
      const range = document.createRange();
      range.selectNodeContents(source);
      getSelection().removeAllRanges();
      getSelection().addRange(range);
      button.textContent = "Press Ctrl+C";
    }
  });

  // Validate a JSON payload before the form is sent.
  for (const form of document.querySelectorAll("form[data-json-field]")) {
    const field = form.elements[form.dataset.jsonField];
    const message = document.getElementById(field.id + "-error");
    form.addEventListener("submit", (event) => {
      let value;
      try {
        value = JSON.parse(field.value.trim() || "{}");
      } catch (error) {
        event.preventDefault();
        message.textContent = "The payload is not valid JSON: " + error.message;
        message.hidden = false;
        field.focus();
        return;
      }
      if (value === null || typeof value !== "object" || Array.isArray(value)) {
        event.preventDefault();
        message.textContent = 'The payload must be a JSON object, such as {"order_id": "ord_123"}.';
        message.hidden = false;
        field.focus();
      }
    });
  }

  // Refresh live parts of a page (run lists; a run whose stream failed) every 2 s.
  const poll = (element, url) => {
    const refresh = async () => {
      try {
        const response = await fetch(url, { credentials: "same-origin" });
        if (!response.ok) return;
        element.innerHTML = await response.text();
        const status = element.querySelector("#run-status");
        if (status && !["queued", "running"].includes(status.dataset.status)) return; // finished
      } catch {
        /* try again on the next tick */
      }
      setTimeout(refresh, 2000);
    };
    setTimeout(refresh, 2000);
  };
  for (const element of document.querySelectorAll("[data-refresh]")) {
    poll(element, element.dataset.refresh);
  }

  // A running run's page follows the run's event stream: each event renders the run's part
  // of the page again (one fetch at a time; events that arrive meanwhile share the next).
  // A step that starts to wait has no event of its own: while the page shows the engine
  // between two steps (data-between-steps), it looks again, 0.25 s later, then 0.5, 1, 2 s.
  const terminal = ["flow.completed", "flow.failed", "flow.cancelled"];
  for (const element of document.querySelectorAll("[data-stream]")) {
    if (!window.EventSource) {
      poll(element, element.dataset.partial);
      continue;
    }
    const source = new EventSource(element.dataset.stream);
    source.addEventListener("open", () => (element.dataset.live = "stream"));
    let busy = false;
    let again = false;
    let look = null; // the timer of the next look while between steps
    let pause = 250;
    const between = () => {
      const status = element.querySelector("#run-status");
      return status !== null && "betweenSteps" in status.dataset;
    };
    const lookAgain = () => {
      clearTimeout(look);
      look = null;
      if (!between() || source.readyState === EventSource.CLOSED) return;
      look = setTimeout(render, pause);
      pause = Math.min(pause * 2, 2000);
    };
    const render = async () => {
      if (busy) {
        again = true;
        return;
      }
      busy = true;
      try {
        const response = await fetch(element.dataset.partial, { credentials: "same-origin" });
        if (response.ok) element.innerHTML = await response.text();
      } catch {
        /* the next event renders again */
      }
      busy = false;
      if (again) {
        again = false;
        render();
      } else {
        lookAgain();
      }
    };
    for (const name of element.dataset.events.split(" ")) {
      source.addEventListener(name, () => {
        if (terminal.includes(name)) source.close(); // the stream ends here
        pause = 250;
        render();
      });
    }
    lookAgain(); // drawn between two steps
    source.addEventListener("error", () => {
      source.close(); // the stream broke (server restarting, signed out): poll instead
      element.dataset.live = "polling";
      poll(element, element.dataset.partial);
    });
  }
})();
