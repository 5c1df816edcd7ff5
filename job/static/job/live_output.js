/* A running job's page: its output as its worker sends it, with no reload.

The page shows the end of the job's log in <pre id="job-output">, the characters from its
data-output-from offset to its data-output-offset one. Every second, while the job has not
finished, this asks the admin's output view (data-output-url) for what follows that end,
adds it, and keeps the last data-output-chars characters shown. A part of the log deleted
before it was read (the view's dropped_before past the offset asked for) is said in a line
where it was. A failed read is tried again later, twice as late each time, up to 10 s.

The output is whatever the job's command printed: it is set as text only (text nodes),
never parsed as HTML. Offsets count characters (code points), as the server does. */
"use strict";

(function () {
  const EVERY_MS = 1000;
  const AT_MOST_MS = 10000;

  const pre = document.getElementById("job-output");
  if (!pre || !pre.dataset.outputUrl) {
    return;
  }
  const status = document.getElementById("job-output-status");
  const url = pre.dataset.outputUrl;
  const keep = Number(pre.dataset.outputChars);
  let end = Number(pre.dataset.outputOffset);
  let delay = EVERY_MS;

  // What is shown: runs of the log, each from its offset, in its own text node; between
  // two runs, the line that says what was deleted before it could be read.
  let before = pre.querySelector(".output-before");
  const first = pre.lastChild && pre.lastChild.nodeType === Node.TEXT_NODE
    ? pre.lastChild
    : pre.appendChild(document.createTextNode(""));
  const from = Number(pre.dataset.outputFrom);
  const runs = [{ offset: from, length: end - from, node: first, gap: null }];

  function say(text) {
    if (status) {
      status.textContent = text;
    }
  }

  function line(css, text) {
    const span = document.createElement("span");
    span.className = css;
    span.textContent = text;
    return span;
  }

  function atBottom() {
    return pre.scrollHeight - pre.scrollTop - pre.clientHeight < 4;
  }

  function shownLength() {
    return runs.reduce((sum, run) => sum + run.length, 0);
  }

  // Only the last `keep` characters stay: the oldest runs go, then the start of the
  // oldest left, and the first line says how many characters come before.
  function trim() {
    let excess = shownLength() - keep;
    while (excess > 0 && runs.length > 1 && runs[0].length <= excess) {
      const gone = runs.shift();
      gone.node.remove();
      runs[0].gap.remove();
      runs[0].gap = null;
      excess -= gone.length;
    }
    if (excess > 0) {
      const oldest = runs[0];
      const cut = Math.min(excess, oldest.length);
      oldest.node.data = Array.from(oldest.node.data).slice(cut).join("");
      oldest.offset += cut;
      oldest.length -= cut;
    }
    const hidden = runs[0].offset;
    if (hidden > 0) {
      if (!before) {
        before = pre.insertBefore(line("output-before", ""), pre.firstChild);
      }
      before.textContent = `[... ${hidden} characters before ...]\n`;
    }
  }

  function show(page) {
    const asked = end;
    const start = Math.max(asked, page.dropped_before);
    const length = page.next_offset - start;
    if (start > asked) {
      const gap = line("output-dropped", `[... ${start - asked} characters dropped ...]\n`);
      const node = document.createTextNode(page.text);
      pre.append(gap, node);
      runs.push({ offset: start, length, node, gap });
    } else if (page.text) {
      const last = runs[runs.length - 1];
      last.node.appendData(page.text);
      last.length += length;
    }
    end = page.next_offset;
    trim();
  }

  async function read() {
    let page;
    try {
      const response = await fetch(`${url}?offset=${end}`, {
        headers: { Accept: "application/json" },
        credentials: "same-origin",
        cache: "no-store",
      });
      if (!response.ok) {
        throw new Error(`the server answered ${response.status}`);
      }
      page = await response.json();
    } catch (error) {
      // A logged-out session is answered with the login page: not JSON either.
      delay = Math.min(delay * 2, AT_MOST_MS);
      say(`The output could not be read (${error.message}): trying again in ${delay / 1000} s.`);
      window.setTimeout(read, delay);
      return;
    }
    delay = EVERY_MS;
    const bottom = atBottom();
    show(page);
    if (bottom) {
      pre.scrollTop = pre.scrollHeight;
    }
    if (page.finished) {
      say(`Job ${page.status}: its output ends here.`);
      return;
    }
    say(`Job ${page.status}: its output shows here as its worker sends it.`);
    window.setTimeout(read, EVERY_MS);
  }

  pre.scrollTop = pre.scrollHeight;
  window.setTimeout(read, EVERY_MS);
})();
