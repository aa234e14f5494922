// 记忆摘要管理页: plain JavaScript, no library. Everything that came from chat is put
// into the page with textContent, never as HTML, and in a <bdi> of its own: right-to-left
// text in a name or message cannot reorder the numbers, times and words around it.
"use strict";

const state = { csrf: null, timer: null, sort: "usage_ratio", desc: true, filter: "", kind: "", days: 30 };
const main = () => document.getElementById("main");

// ---- DOM helpers ---------------------------------------------------------------------
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (k === "class") node.className = v;
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}
const svg = (tag, attrs, ...children) => {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  for (const child of children.flat(Infinity)) if (child != null) node.append(child instanceof Node ? child : String(child));
  return node;
};
const num = (n) => (n === null || n === undefined ? "—" : Number(n).toLocaleString("zh-CN"));
const pad = (n) => String(n).padStart(2, "0");
function when(ts) {
  if (!ts) return "—";
  const d = new Date(ts * 1000);
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}`;
}
function money(cost) {
  const parts = Object.entries(cost || {}).map(([cur, v]) => `${v.toFixed(4)} ${cur}`.trim());
  return parts.length ? parts.join(" + ") : "—";
}
function gauge(ratio, label) {
  if (ratio === null || ratio === undefined) return el("div", { class: "muted small" }, label || "—");
  const g = el("div", { class: "gauge" + (ratio >= 1 ? " full" : ratio >= 0.8 ? " warn" : ""), title: label });
  const bar = el("span");
  bar.style.width = Math.min(100, Math.round(ratio * 100)) + "%";
  g.append(bar);
  return el("div", {}, g, el("span", { class: "small muted" }, label));
}
function outcomeTag(run) {
  if (!run) return el("span", { class: "muted" }, "未压缩过");
  const ok = run.outcome === "done";
  return el("span", {}, el("span", { class: "tag " + (ok ? "good" : "bad") }, ok ? "成功" : "失败"), " ",
    el("span", { class: "small muted" }, when(run.ts)), ok ? null : el("div", { class: "small error" }, run.reason || ""));
}
function setMain(...nodes) {
  // Left-out parts (null) are skipped, as el() skips them: the DOM would write "null".
  main().replaceChildren(...nodes.filter((n) => n !== null && n !== undefined && n !== false));
}
function flash(text, bad) {
  // `text`: a string, or nodes (a value the owner typed goes in a <bdi> of its own).
  const box = document.getElementById("flash");
  if (box) { box.replaceChildren(...[text].flat()); box.className = bad ? "notice error" : "notice"; box.hidden = false; }
}
function confirmDialog(text) {
  const modal = document.getElementById("modal");
  document.getElementById("modal-text").textContent = text;
  modal.hidden = false;
  return new Promise((resolve) => {
    const done = (answer) => () => { modal.hidden = true; ok.onclick = cancel.onclick = null; resolve(answer); };
    const ok = document.getElementById("modal-ok");
    const cancel = document.getElementById("modal-cancel");
    ok.onclick = done(true);
    cancel.onclick = done(false);
  });
}

// ---- API -----------------------------------------------------------------------------
class SignedOut extends Error {}
class Refused extends Error { constructor(message, status) { super(message); this.status = status; } }
const UNREACHABLE = "连不上机器人：它可能正在重启或已停止，也可能是网络断了";
async function api(path, options = {}) {
  const init = { credentials: "same-origin", headers: {} };
  if (options.body !== undefined) {
    init.method = "POST";
    init.headers["Content-Type"] = "application/json";
    init.headers["X-Memsum-CSRF"] = state.csrf || "";
    init.body = JSON.stringify(options.body);
  }
  let resp;
  try { resp = await fetch("api/" + path, init); }
  catch (err) { throw new Error(UNREACHABLE); } // the browser's own words are English ("Failed to fetch")
  if (resp.status === 401 && path !== "login") { state.csrf = null; throw new SignedOut(); }
  const data = await resp.json().catch(() => ({}));
  if (!resp.ok) throw new Refused(typeof data.detail === "string" ? data.detail : `请求失败（${resp.status}）`, resp.status);
  return data;
}

// ---- pages ---------------------------------------------------------------------------
function loginPage(message) {
  document.getElementById("nav").hidden = true;
  const input = el("input", { type: "password", id: "token", autocomplete: "current-password", placeholder: "MEMSUM_WEB_TOKEN", required: true });
  const error = el("p", { class: "error", id: "login-error" }, message || "");
  const form = el("form", { class: "card login", id: "login-form" },
    el("h1", {}, "登录"), el("p", { class: "muted small" }, "请输入机器人 .env 里的 MEMSUM_WEB_TOKEN。"),
    input, el("button", { type: "submit" }, "登录"), error);
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    try {
      const data = await api("login", { body: { token: input.value } });
      state.csrf = data.csrf;
      route();
    } catch (err) {
      error.textContent = err.message;
    }
  });
  setMain(form);
  input.focus();
}

// Names as a Chinese reader orders them (by pinyin), numbers by their value (99999 before 100000).
const byName = new Intl.Collator("zh-CN", { numeric: true });
function sortValue(row, key) {
  switch (key) {
    case "name": return row.name || row.number || row.id;
    case "active": return row.active;
    case "archived": return row.archived;
    case "count_ratio": return row.count_ratio ?? -1;
    case "last": return row.last_compression ? row.last_compression.ts : 0;
    case "last_ts": return row.last_ts;
    default: return row.usage_ratio ?? -1;
  }
}

async function overviewPage() {
  const data = await api("overview");
  const titles = data.setting_titles;
  const hasMode = data.sessions.some((s) => s.settings.mode);
  const today = data.today;
  const filter = el("input", { type: "search", id: "filter", placeholder: "按群名、群号、QQ 号筛选", value: state.filter });
  const kind = el("select", { id: "kind" }, ["", "群聊", "私聊", "内部"].map((k) => el("option", { value: k, selected: k === state.kind }, k || "全部")));
  const body = el("tbody");
  const headers = [["name", "会话"], hasMode ? ["mode", titles.mode || "模式"] : null, ["active", "活跃"], ["archived", "归档"],
    ["usage_ratio", "用量 / 压缩线"], ["count_ratio", "条数 / 条数线"], ["last", "上次压缩"], ["backoff", "退避"]].filter(Boolean);
  const head = el("tr", {}, headers.map(([key, label]) => el("th", {
    class: ["mode", "backoff"].includes(key) ? "" : "sortable", "data-key": key,
    onclick: () => { if (["mode", "backoff"].includes(key)) return; state.desc = state.sort === key ? !state.desc : true; state.sort = key; draw(); },
  }, label + (state.sort === key ? (state.desc ? " ↓" : " ↑") : ""))));
  // Two QQ accounts in one group: a session of each, told apart by the account.
  const manyAccounts = new Set(data.sessions.map((s) => s.account).filter(Boolean)).size > 1;
  const subtitle = (s) => [s.name && s.number ? s.number : "", manyAccounts && s.account ? "账号 " + s.account : ""].filter(Boolean).join(" · ");
  function draw() {
    const needle = state.filter.trim().toLowerCase();
    const rows = data.sessions.filter((s) => (!state.kind || s.kind === state.kind) &&
      (!needle || `${s.name} ${s.number} ${s.id}`.toLowerCase().includes(needle)));
    rows.sort((a, b) => { const x = sortValue(a, state.sort), y = sortValue(b, state.sort);
      const order = typeof x === "string" ? byName.compare(x, y) : x < y ? -1 : x > y ? 1 : 0;
      return order * (state.desc ? -1 : 1); });
    body.replaceChildren(...rows.map((s) => el("tr", { class: "clickable session-row", "data-id": s.id, onclick: () => { location.hash = "#/s/" + encodeURIComponent(s.id); } },
      el("td", { "data-label": "会话" }, el("div", {}, el("span", { class: "tag" }, s.kind), " ", el("bdi", {}, s.name || s.number || s.id)), subtitle(s) ? el("div", { class: "small muted" }, subtitle(s)) : null),
      hasMode ? el("td", { "data-label": "模式" }, s.settings.mode ? s.settings.mode.text : "—",
        s.daily_cap && s.daily_cap.spent ? [" ", el("span", { class: "tag bad", title: `今日 ${num(s.daily_cap.used)} / 限额 ${num(s.daily_cap.cap)}` }, "今日限额已用完")] : null) : null,
      el("td", { class: "num", "data-label": "活跃" }, num(s.active)),
      el("td", { class: "num", "data-label": "归档" }, num(s.archived)),
      el("td", { "data-label": "用量" }, gauge(s.usage_ratio, s.usage === null ? "无记录" : s.line ? `${num(s.usage)} / ${num(s.line)}` : `${num(s.usage)}（压缩线关）`)),
      el("td", { "data-label": "条数" }, gauge(s.count_ratio, s.settings.history_limit && s.settings.history_limit.value ? `${num(s.active)} / ${num(s.settings.history_limit.value)}` : "条数线关")),
      el("td", { "data-label": "上次压缩" }, s.running ? el("span", { class: "tag warn" }, "压缩中…") : outcomeTag(s.last_compression)),
      el("td", { "data-label": "退避" }, s.backoff_failures ? el("span", { class: "tag warn" }, `失败 ${s.backoff_failures} 次，${s.backoff_turns_left} 轮后重试`) : "—"),
    )));
    head.replaceChildren(...headers.map(([key, label]) => el("th", {
      class: ["mode", "backoff"].includes(key) ? "" : "sortable", "data-key": key,
      onclick: () => { if (["mode", "backoff"].includes(key)) return; state.desc = state.sort === key ? !state.desc : true; state.sort = key; draw(); },
    }, label + (state.sort === key ? (state.desc ? " ↓" : " ↑") : ""))));
    count.textContent = `共 ${rows.length} 个会话`;
  }
  const count = el("span", { class: "muted small", id: "count" });
  filter.addEventListener("input", () => { state.filter = filter.value; draw(); });
  kind.addEventListener("change", () => { state.kind = kind.value; draw(); });
  setMain(
    el("h1", {}, "总览"),
    el("div", { class: "card stats", id: "today" },
      el("div", { class: "stat" }, el("span", { class: "muted small" }, "今日调用"), el("b", {}, num(today.calls))),
      el("div", { class: "stat" }, el("span", { class: "muted small" }, "今日输入 token"), el("b", {}, num(today.tokens_in))),
      el("div", { class: "stat" }, el("span", { class: "muted small" }, "今日输出 token"), el("b", {}, num(today.tokens_out))),
      el("div", { class: "stat" }, el("span", { class: "muted small" }, "今日费用"), el("b", {}, money(today.cost)),
        today.unpriced ? el("span", { class: "small muted" }, "部分模型未设置价格") : null)),
    el("div", { class: "row" }, filter, kind, count),
    el("div", { class: "table-wrap" }, el("table", { class: "cards", id: "sessions" }, el("thead", {}, head), body)),
  );
  draw();
  return 5000;
}

function usageChart(series, line, runs) {
  const W = 640, H = 220, L = 48, R = 10, T = 10, B = 24;
  const times = series.map((p) => p[0]).concat(runs.map((r) => r.ts));
  if (!times.length) return el("p", { class: "muted", id: "chart-empty" }, "还没有用量记录。");
  const t0 = Math.min(...times), t1 = Math.max(...times, t0 + 1);
  const ymax = Math.max(1, line || 0, ...series.map((p) => p[1]), ...runs.map((r) => r.tokens_before || 0)) * 1.1;
  const x = (t) => L + ((t - t0) / (t1 - t0)) * (W - L - R);
  const y = (v) => T + (1 - v / ymax) * (H - T - B);
  const parts = [svg("line", { x1: L, y1: y(0), x2: W - R, y2: y(0), stroke: "#9ca3af" })];
  for (const frac of [0.5, 1]) parts.push(svg("text", { x: 2, y: y(ymax * frac / 1.1) + 4 }, num(Math.round(ymax * frac / 1.1))));
  for (const r of runs) {
    parts.push(svg("line", { x1: x(r.ts), y1: T, x2: x(r.ts), y2: y(0), stroke: r.outcome === "done" ? "#059669" : "#dc2626", "stroke-dasharray": "2 3", class: "marker" },
      svg("title", {}, `${when(r.ts)} 压缩${r.outcome === "done" ? "成功" : "失败"}`)));
  }
  if (line) parts.push(svg("line", { x1: L, y1: y(line), x2: W - R, y2: y(line), stroke: "#d97706", "stroke-dasharray": "6 4", class: "line" }),
    svg("text", { x: W - R - 70, y: y(line) - 4 }, "压缩线 " + num(line)));
  if (series.length) {
    parts.push(svg("polyline", { points: series.map((p) => `${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(" "), fill: "none", stroke: "#2563eb", "stroke-width": 2 }));
    for (const p of series) parts.push(svg("circle", { cx: x(p[0]), cy: y(p[1]), r: 2.5, fill: "#2563eb" }, svg("title", {}, `${when(p[0])}：${num(p[1])} token`)));
  }
  parts.push(svg("text", { x: L, y: H - 6 }, when(t0)), svg("text", { x: W - R - 95, y: H - 6 }, when(t1)));
  return el("div", {}, svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart", id: "usage-chart", role: "img", "aria-label": "用量变化图" }, parts),
    el("div", { class: "legend" }, "蓝线：每次对话的用量；橙色虚线：压缩线；竖线：压缩（绿色成功，红色失败）"));
}

// A message its sender (or an admin) withdrew on QQ: the page shows it, marked; chat never repeats it.
const withdrawnTag = (m) => m.withdrawn ? el("span", { class: "tag warn" }, "已撤回")
  : m.refused ? el("span", { class: "tag warn", title: "模型服务商的内容审核拒绝了这条消息；发给模型的是占位文字" }, "未过审") : null;

function messageList(messages, empty) {
  if (!messages.length) return empty ? el("p", { class: "muted" }, empty) : null;
  return el("div", {}, messages.map((m) => el("div", { class: "msg" }, el("span", { class: "when" }, when(m.ts)), withdrawnTag(m), el("bdi", { class: "pre" }, m.content))));
}

function settingRow(sid, s, group, modes) {
  let input;
  if (s.name === "mode") input = el("select", { name: s.name }, Object.entries(modes).map(([key, word]) => el("option", { value: key, selected: key === s.value }, word)));
  else if (s.name === "persona") input = el("textarea", { name: s.name });
  else input = el("input", { name: s.name, inputmode: "decimal" });
  if (s.name !== "mode") input.value = s.value === null || s.value === undefined ? "" : String(s.value);
  const scope = group ? el("select", { name: "scope" }, el("option", { value: "session" }, "本会话"), el("option", { value: "place" }, "本群")) : null;
  const save = async (value) => {
    try {
      const result = await api(`sessions/${encodeURIComponent(sid)}/settings`, { body: { name: s.name, scope: scope ? scope.value : "session", value } });
      await route();
      flash([`${s.title} 现在是 `, el("bdi", {}, result.text), `（${result.layer_label}）`]);
    } catch (err) { if (err instanceof SignedOut) return loginPage(); flash(err.message, true); }
  };
  return el("tr", { class: "setting", "data-name": s.name },
    el("td", { "data-label": "设置" }, s.title),
    el("td", { "data-label": "当前值" }, el("b", { class: s.name === "persona" ? "pre" : "" }, el("bdi", {}, s.text)), " ", el("span", { class: "tag" }, s.layer_label)),
    el("td", { "data-label": "修改" }, el("div", { class: "row" }, input, scope,
      el("button", { type: "button", class: "save", onclick: () => save(input.value) }, "保存"),
      el("button", { type: "button", class: "plain reset", onclick: () => save(null) }, "恢复默认"))));
}

async function sessionPage(sid) {
  const d = await api("sessions/" + encodeURIComponent(sid));
  const path = `sessions/${encodeURIComponent(sid)}`;
  const act = async (what, body, done) => {
    try { await api(`${path}/${what}`, { body }); await route(); if (done) flash(done); }
    catch (err) { if (err instanceof SignedOut) return loginPage(); flash(err.message, true); }
  };
  const progress = d.running ? "正在压缩…" + (d.progress && d.progress.phase === "running" ? `（已 ${Math.max(0, Math.round(Date.now() / 1000 - d.progress.since))} 秒）` : "")
    : d.progress ? d.progress.text : "";
  const searchBox = el("div", { class: "card", id: "search" });
  const q = el("input", { type: "search", name: "q", placeholder: "关键词，如 提取码", required: true });
  const speaker = el("input", { name: "speaker", placeholder: "发言人（QQ 号或昵称）" });
  const since = el("input", { type: "date", name: "since" });
  const until = el("input", { type: "date", name: "until" });
  const out = el("div", { id: "search-results" });
  const form = el("form", { class: "row" }, q, speaker, since, until, el("button", { type: "submit" }, "搜索"));
  const show = (results, more) => out.replaceChildren(...(results.length ? results : [null]).map((x) => x ? hitView(x) : el("p", { class: "muted" }, "没有找到。")),
    // Nothing, not a null, when all are listed: the DOM writes a null as the text "null".
    ...(more ? [el("p", { class: "muted small" }, `只列出最相关的 ${results.length} 条，还有更多：加关键词、发言人或日期可缩小范围。`)] : []));
  const hitView = (x) => el("div", { class: "hit" },
    messageList(x.before, ""), el("div", { class: "msg found" }, el("span", { class: "when" }, when(x.hit.ts)), withdrawnTag(x.hit), el("bdi", { class: "pre" }, x.hit.content)),
    messageList(x.after, ""));
  // The page refreshes itself every few seconds: the last search of this session stays.
  if (state.search && state.search.sid === sid) {
    [q.value, speaker.value, since.value, until.value] = state.search.values;
    show(state.search.results, state.search.more);
  }
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const params = new URLSearchParams({ q: q.value });
    for (const [k, v] of [["speaker", speaker.value], ["since", since.value], ["until", until.value]]) if (v) params.set(k, v);
    try {
      const r = await api(`${path}/search?${params}`);
      state.search = { sid, values: [q.value, speaker.value, since.value, until.value], results: r.results, more: r.more };
      show(r.results, r.more);
    } catch (err) { out.replaceChildren(el("p", { class: "error" }, err.message)); }
  });
  searchBox.append(form, el("p", { class: "muted small" }, "搜索本会话的全部消息（含已归档的和已撤回的，后者标出「已撤回」），不含清除过的；每条结果带前后各两条。"), out);
  setMain(
    el("p", {}, el("a", { href: "#/" }, "← 返回总览")),
    el("h1", { id: "session-title" }, el("span", { class: "tag" }, d.kind), " ", el("bdi", {}, d.name || d.number || d.id), d.name && d.number ? el("span", { class: "muted small" }, " " + d.number) : null,
      d.account ? el("span", { class: "muted small" }, " · 账号 " + d.account) : null),
    el("div", { id: "flash", class: "notice", hidden: true }),
    el("div", { class: "card stats" },
      el("div", { class: "stat" }, el("span", { class: "muted small" }, "用量 / 压缩线"), gauge(d.usage_ratio, d.usage === null ? "无记录" : d.line ? `${num(d.usage)} / ${num(d.line)}` : "压缩线关")),
      el("div", { class: "stat" }, el("span", { class: "muted small" }, "条数 / 条数线"), gauge(d.count_ratio, d.history_limit ? `${num(d.active)} / ${num(d.history_limit)}` : `${num(d.active)}（条数线关）`)),
      el("div", { class: "stat" }, el("span", { class: "muted small" }, "退避"), el("b", {}, d.backoff_failures ? `失败 ${d.backoff_failures} 次，${d.backoff_turns_left} 轮后重试` : "无")),
      d.daily_cap ? el("div", { class: "stat", id: "daily-cap" }, el("span", { class: "muted small" }, "今日用量 / 每日限额"),
        d.daily_cap.cap > 0 ? gauge(d.daily_cap.ratio, `${num(d.daily_cap.used)} / ${num(d.daily_cap.cap)}` + (d.daily_cap.spent ? "，已用完，今天不再回答" : ""))
          : el("b", {}, `${num(d.daily_cap.used)}（不限）`)) : null),
    el("div", { class: "row" },
      el("button", { type: "button", id: "compress", disabled: d.running, onclick: () => act("compress", {}, "已开始压缩") }, "立即压缩"),
      el("button", { type: "button", class: "plain", id: "clear-summary", onclick: async () => { if (await confirmDialog("清除本会话的摘要？上下文保留。")) act("clear", { kind: "summary" }, "已清除摘要"); } }, "清除摘要"),
      el("button", { type: "button", class: "danger", id: "clear-context", onclick: async () => { if (await confirmDialog("将清除本会话的全部上下文和摘要，无法恢复。确定吗？")) act("clear", { kind: "context", confirm: true }, "已清除上下文和摘要"); } }, "清除上下文"),
      el("span", { id: "progress", class: d.running ? "tag warn" : "muted small" }, progress)),
    el("h2", {}, "摘要"),
    el("div", { class: "card", id: "summary" }, d.summary.sections.length ? [el("p", { class: "muted small" }, "更新于 " + when(d.summary.time)),
      d.summary.sections.map((s) => el("div", {}, s.title ? el("div", { class: "section-title" }, "【" + s.title + "】") : null, el("div", { class: "pre" }, s.body)))] : el("p", { class: "muted" }, "还没有摘要。")),
    el("h2", {}, `保留原文（${d.kept.length} 条）`),
    el("div", { class: "card", id: "kept" }, messageList(d.kept, "没有保留的原文。")),
    el("h2", {}, "用量变化"),
    el("div", { class: "card" }, usageChart(d.series, d.line, d.compressions)),
    el("h2", {}, "压缩记录"),
    el("div", { class: "table-wrap" }, d.compressions.length ? el("table", { class: "cards", id: "compressions" },
      el("thead", {}, el("tr", {}, ["时间", "结果", "压缩前", "压缩后", "保留", "归档", "请求数", "压缩线"].map((h) => el("th", {}, h)))),
      el("tbody", {}, d.compressions.map((r) => el("tr", {},
        el("td", { "data-label": "时间" }, when(r.ts)),
        el("td", { "data-label": "结果" }, r.outcome === "done" ? el("span", { class: "tag good" }, "成功") : el("span", {}, el("span", { class: "tag bad" }, "失败"), " ", r.reason || "")),
        el("td", { class: "num", "data-label": "压缩前" }, num(r.tokens_before)),
        el("td", { class: "num", "data-label": "压缩后" }, num(r.tokens_after)),
        el("td", { class: "num", "data-label": "保留" }, num(r.kept)),
        el("td", { class: "num", "data-label": "归档" }, num(r.archived)),
        el("td", { class: "num", "data-label": "请求数" }, num(r.requests)),
        el("td", { class: "num line", "data-label": "压缩线" }, num(r.line)))))) : el("p", { class: "muted" }, "还没有压缩过。")),
    el("h2", {}, "搜索"), searchBox,
    el("h2", {}, "设置"),
    el("div", { class: "table-wrap" }, el("table", { class: "cards", id: "settings" }, el("tbody", {}, d.settings.map((s) => settingRow(sid, s, d.group, d.modes))))),
    el("p", { class: "muted small" }, "压缩线是窗口的比例（0~1，0 表示不按用量压缩）；条数线是条数（0 表示不按条数压缩）；每日限额是 token 数（0 表示不限）。「恢复默认」删掉这一层的值，用下一层的。"),
    el("h2", {}, "最近消息"),
    el("div", { class: "card", id: "recent" }, messageList(d.recent, "没有活跃消息。")),
  );
  return d.running ? 1000 : 3000;
}

function barChart(rows) {
  const days = [...new Set(rows.map((r) => r.day))];
  if (!days.length) return el("p", { class: "muted" }, "这段时间没有用量。");
  const purposes = [...new Set(rows.map((r) => r.purpose))];
  const colors = ["#2563eb", "#d97706", "#059669", "#7c3aed", "#db2777"];
  const total = (day, p) => rows.filter((r) => r.day === day && r.purpose === p).reduce((a, r) => a + r.tokens_in + r.tokens_out, 0);
  const max = Math.max(1, ...days.map((d) => purposes.reduce((a, p) => a + total(d, p), 0)));
  const W = 640, H = 200, L = 48, B = 24, bw = (W - L) / days.length;
  const parts = [svg("text", { x: 2, y: 14 }, num(max))];
  days.forEach((day, i) => {
    let top = H - B;
    purposes.forEach((p, j) => {
      if (!total(day, p)) return; // no bar for a purpose that day had none of
      const h = (total(day, p) / max) * (H - B - 10);
      top -= h;
      parts.push(svg("rect", { x: L + i * bw + 1, y: top, width: Math.max(1, bw - 2), height: h, fill: colors[j % colors.length] }, svg("title", {}, `${day} ${p}：${num(total(day, p))} token`)));
    });
  });
  parts.push(svg("text", { x: L, y: H - 6 }, days[0]), svg("text", { x: W - 80, y: H - 6 }, days[days.length - 1]));
  return el("div", {}, svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart", id: "usage-bars" }, parts),
    el("div", { class: "legend" }, purposes.map((p, j) => el("span", { class: "swatch-" + (j % colors.length) }, (j ? "，" : "") + ["蓝", "橙", "绿", "紫", "粉"][j % 5] + "色：" + p)), "（每天输入加输出 token）"));
}

async function usagePage() {
  const d = await api("usage?days=" + state.days);
  const days = el("select", { id: "days" }, [7, 30, 90, 365].map((n) => el("option", { value: n, selected: n === state.days }, `最近 ${n} 天`)));
  days.addEventListener("change", () => { state.days = Number(days.value); route(); });
  const t = d.totals;
  setMain(
    el("h1", {}, "用量与费用"),
    el("div", { class: "row" }, days, el("a", { href: "api/usage.csv?days=" + state.days, id: "csv", download: true }, "导出 CSV")),
    el("div", { class: "card stats" },
      el("div", { class: "stat" }, el("span", { class: "muted small" }, "调用"), el("b", {}, num(t.calls))),
      el("div", { class: "stat" }, el("span", { class: "muted small" }, "输入 token（缓存命中）"), el("b", {}, `${num(t.tokens_in)}（${num(t.tokens_cached)}）`)),
      el("div", { class: "stat" }, el("span", { class: "muted small" }, "输出 token"), el("b", {}, num(t.tokens_out))),
      el("div", { class: "stat" }, el("span", { class: "muted small" }, "费用"), el("b", {}, money(t.cost)), t.unpriced ? el("span", { class: "small muted" }, "部分模型未设置价格") : null)),
    el("div", { class: "card" }, barChart(d.rows)),
    el("div", { class: "table-wrap" }, el("table", { class: "cards", id: "usage-table" },
      el("thead", {}, el("tr", {}, ["日期", "模型", "用途", "调用", "输入 token", "其中缓存命中", "输出 token", "费用"].map((h) => el("th", {}, h)))),
      el("tbody", {}, d.rows.slice().reverse().map((r) => el("tr", {},
        el("td", { "data-label": "日期" }, r.day), el("td", { "data-label": "模型" }, r.model), el("td", { "data-label": "用途" }, r.purpose),
        el("td", { class: "num", "data-label": "调用" }, num(r.calls)), el("td", { class: "num", "data-label": "输入" }, num(r.tokens_in)),
        el("td", { class: "num", "data-label": "缓存命中" }, num(r.tokens_cached)),
        el("td", { class: "num", "data-label": "输出" }, num(r.tokens_out)),
        el("td", { class: "num", "data-label": "费用" }, r.cost === null ? "—" : `${r.cost.toFixed(4)} ${r.currency}`)))))),
  );
  return 30000;
}

// ---- routing and live updates (polling) -----------------------------------------------
let generation = 0;
const RETRY_MS = 5000;
async function route() {
  clearTimeout(state.timer);
  const mine = ++generation;
  try {
    if (!state.csrf) state.csrf = (await api("me")).csrf;
    document.getElementById("nav").hidden = false;
    const hash = location.hash || "#/";
    let every;
    if (hash.startsWith("#/s/")) every = await sessionPage(decodeURIComponent(hash.slice(4)));
    else if (hash === "#/usage") every = await usagePage();
    else every = await overviewPage();
    if (mine === generation) state.timer = setTimeout(refresh, every);
  } catch (err) {
    if (err instanceof SignedOut) return loginPage();
    // A session that is not there (404) will not come back by asking again; anything else
    // may: a bot restarting, or a proxy's 502 meanwhile.
    const again = !(err instanceof Refused && err.status === 404);
    setMain(el("p", { class: "error" }, err.message), again ? el("p", { class: "muted small" }, "稍后自动重试。") : null,
      el("p", {}, el("a", { href: "#/" }, "返回总览")));
    if (again && mine === generation) state.timer = setTimeout(refresh, RETRY_MS);
  }
}
function refresh() {
  const active = document.activeElement;
  // Keep what the owner is typing: no refresh while a field of the page has the focus.
  if (active && ["INPUT", "TEXTAREA", "SELECT"].includes(active.tagName)) {
    state.timer = setTimeout(refresh, 2000);
    return;
  }
  const flashBox = document.getElementById("flash");
  const kept = flashBox && !flashBox.hidden ? [[...flashBox.childNodes], flashBox.className] : null;
  route().then(() => {
    const box = document.getElementById("flash");
    if (kept && box) { box.replaceChildren(...kept[0]); box.className = kept[1]; box.hidden = false; }
  });
}

window.addEventListener("hashchange", route);
document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("logout").addEventListener("click", async () => {
    try { await api("logout", { body: {} }); } catch (err) { /* signed out already */ }
    state.csrf = null;
    loginPage();
  });
  route();
});
