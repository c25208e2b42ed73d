// fencegw dashboard: lease TTL countdowns and the live feed of rejected
// writes. Everything from clients is put in the page with textContent,
// never as HTML. The pages work without this script; it only keeps them
// current.
(function () {
  'use strict';

  var MAX_ROWS = 500; // the feed keeps at most this many rows in the DOM

  function human(ms) {
    if (ms < 1000) return Math.round(ms) + ' ms';
    if (ms < 60000) return (ms / 1000).toFixed(1) + ' s';
    var s = Math.floor(ms / 1000);
    if (s < 3600) return Math.floor(s / 60) + ' min ' + (s % 60) + ' s';
    return Math.floor(s / 3600) + ' h ' + Math.floor((s % 3600) / 60) + ' min';
  }

  function clock(iso) {
    return new Date(iso).toISOString().substring(11, 23);
  }

  // The server's clock minus ours, so countdowns follow the gateway's time.
  function skewOf(el) {
    var now = el && el.getAttribute('data-now');
    return now ? Date.parse(now) - Date.now() : 0;
  }

  // Cells are looked up on every tick: refresh() replaces the leases table,
  // and the skew is taken again from each new table when it first appears.
  function countdowns() {
    var table = null, skew = 0;
    function tick() {
      var t = document.getElementById('leases');
      if (t !== table) { table = t; skew = skewOf(t); }
      var now = Date.now() + skew;
      var cells = document.querySelectorAll('[data-expires]');
      for (var i = 0; i < cells.length; i++) {
        var left = Date.parse(cells[i].getAttribute('data-expires')) - now;
        cells[i].textContent = left > 0 ? human(left) : 'expired';
        cells[i].classList.toggle('bad', left <= 0);
      }
    }
    tick();
    setInterval(tick, 200);
  }

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function cell(tr, child) {
    var td = el('td');
    if (typeof child === 'string') td.textContent = child; else td.appendChild(child);
    tr.appendChild(td);
    return td;
  }

  function rejectionRow(r) {
    var tr = el('tr', 'new');
    tr.setAttribute('data-id', String(r.id));
    tr.setAttribute('data-repeats', String(r.repeats || 1));
    var when = cell(tr, clock(r.at));
    // Repeats of one lease's refusal are one entry: "×37 since 12:00:01".
    if (r.repeats > 1) when.appendChild(el('span', 'muted repeats', ' ×' + r.repeats + ' since ' + clock(r.first_at)));
    if (r.resource) {
      var a = el('a', '', r.resource);
      a.href = '/ui/resources/' + encodeURIComponent(r.resource);
      cell(tr, a);
    } else {
      cell(tr, el('span', 'muted', '—'));
    }
    cell(tr, el('code', '', r.method + ' ' + r.upstream + r.path));
    // A refusal without a token (an unknown lease) has nothing to compare.
    var tok;
    if (r.token) {
      tok = cell(tr, el('span', 'stale', String(r.token)));
      tok.appendChild(document.createTextNode(' '));
      tok.appendChild(el('span', 'muted', 'vs'));
      tok.appendChild(document.createTextNode(' ' + r.current_token));
    } else {
      tok = cell(tr, el('span', 'muted', '—'));
    }
    tok.className = 'n';
    var who = cell(tr, r.holder);
    if (r.principal) who.appendChild(el('span', 'muted', ' · key ' + r.principal));
    var reason = cell(tr, el('span', 'code ' + r.code, r.code));
    if (r.would_refuse) {
      tr.className += ' observed';
      reason.appendChild(document.createTextNode(' '));
      reason.appendChild(el('span', 'observed-note', 'would refuse: observe only, forwarded, nothing was blocked'));
    }
    if (r.trace_id) {
      var trace = el('span', 'trace muted', ' trace ');
      trace.appendChild(el('code', '', r.trace_id));
      reason.appendChild(trace);
    }
    if (r.lease_ended_at) {
      cell(tr, human(Date.parse(r.at) - Date.parse(r.lease_ended_at)));
    } else {
      cell(tr, el('span', 'muted', '—'));
    }
    return tr;
  }

  function summaryRow(s) {
    var tr = el('tr', 'summary new');
    var parts = [];
    for (var code in s.codes || {}) parts.push(code + ': ' + s.codes[code]);
    var text = s.count + ' more rejections' + (parts.length ? ' (' + parts.join(', ') + ')' : '');
    if (s.count) text += ', ' + clock(s.from) + '–' + clock(s.to);
    if (s.gap) text += (s.count ? '; ' : '') + 'more were missed while disconnected than can be replayed: see the rejection log';
    var td = cell(tr, text);
    td.colSpan = 7;
    return tr;
  }

  function feed() {
    var table = document.getElementById('feed');
    var status = document.getElementById('feed-status');
    if (!table || !window.EventSource) return;
    var body = table.tBodies[0];
    var url = table.getAttribute('data-stream');
    var after = table.getAttribute('data-after');
    if (after && after !== '0') url += (url.indexOf('?') < 0 ? '?' : '&') + 'after=' + encodeURIComponent(after);

    function add(tr) {
      var id = tr.getAttribute('data-id');
      // The page was rendered after the stream's starting point, so the
      // stream may replay a row the page already shows.
      // A repeat counted on a shown entry moves it to the top, with its
      // new count; an entry no newer than the shown one is a replay.
      var shown = id && body.querySelector('tr[data-id="' + id + '"]');
      if (shown) {
        // A row the page rendered keeps its count on its first cell.
        var had = shown.getAttribute('data-repeats') || (shown.cells[0] && shown.cells[0].getAttribute('data-repeats')) || 1;
        if (Number(tr.getAttribute('data-repeats')) <= Number(had)) return;
        shown.remove();
      }
      var empty = body.querySelector('tr.empty');
      if (empty) empty.remove();
      body.insertBefore(tr, body.firstChild);
      while (body.rows.length > MAX_ROWS) body.deleteRow(body.rows.length - 1);
      setTimeout(function () { tr.classList.remove('new'); }, 1600);
    }
    function say(text, live) {
      if (!status) return;
      status.textContent = text;
      status.classList.toggle('live', !!live);
    }

    // EventSource reconnects by itself and sends Last-Event-ID, so the
    // server replays what was missed.
    var es = new EventSource(url);
    es.onopen = function () { say('live', true); };
    es.onerror = function () { say(es.readyState === EventSource.CLOSED ? 'disconnected: reload' : 'reconnecting…', false); };
    // A row in the feed means the counts, the chart and the leases have
    // changed too: refresh them now rather than at the next poll, so that
    // the page never shows a rejection that its cards do not count.
    es.addEventListener('rejection', function (e) { add(rejectionRow(JSON.parse(e.data))); refreshSoon(); });
    es.addEventListener('summary', function (e) { add(summaryRow(JSON.parse(e.data))); refreshSoon(); });
  }

  // refreshSoon is set by refresh(); a no-op on pages without live parts.
  var refreshSoon = function () {};

  // refresh keeps the counts, the chart, the top lists and the held leases
  // current: it fetches this same page (same filters) and swaps in the
  // server-rendered parts (each element marked data-live, by id; the feed
  // sits between them), which the server escaped like any page load.
  // The server computes that part from one read of the store, so the cards,
  // the chart and the leases table always agree with one another; the feed
  // calls refreshSoon() on every row it adds, so they agree with the feed
  // within a fetch. It polls as well (leases change without a rejection),
  // skips hidden tabs, never overlaps two fetches, and a refresh asked for
  // during a fetch runs right after it.
  function refresh() {
    var live = document.getElementById('live-overview');
    if (!live || !window.fetch || !window.DOMParser) return;
    var every = parseInt(live.getAttribute('data-refresh-ms'), 10) || 5000;
    var busy = false, again = false, timer = null;
    function once() {
      if (document.hidden) return;
      if (busy) { again = true; return; }
      busy = true;
      again = false;
      fetch(window.location.href, { credentials: 'same-origin', headers: { Accept: 'text/html' }, cache: 'no-store' })
        .then(function (resp) { return resp.ok ? resp.text() : null; })
        .then(function (html) {
          if (!html) return;
          var doc = new DOMParser().parseFromString(html, 'text/html');
          var parts = document.querySelectorAll('[data-live]');
          for (var i = 0; i < parts.length; i++) {
            var fresh = doc.getElementById(parts[i].id);
            if (fresh) parts[i].replaceWith(document.importNode(fresh, true));
          }
        })
        .catch(function () {})
        .then(function () {
          busy = false;
          if (again) once();
        });
    }
    // Rejections come in bursts: one fetch per 100 ms at most.
    refreshSoon = function () {
      if (timer) return;
      timer = setTimeout(function () { timer = null; once(); }, 100);
    };
    setInterval(once, every);
    document.addEventListener('visibilitychange', once);
  }

  function start() {
    countdowns();
    refresh();
    feed();
  }
  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', start); else start();
})();
