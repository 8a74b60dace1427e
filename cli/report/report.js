// lattrace report: draws the charts of the model in #lattrace-data with
// the inlined Apache ECharts. Every chart is registered in
// window.lattraceReport.charts (pair, kind, ECharts instance) so a test,
// or a curious reader in the console, can see what each one holds.
"use strict";
(function () {
  const report = (window.lattraceReport = { ready: false, charts: [], errors: [] });
  window.addEventListener("error", (e) => report.errors.push(String(e.message)));

  const M = JSON.parse(document.getElementById("lattrace-data").textContent);

  const colors = {
    network: "#3b7dd8", send_wait: "#e8833a", loss_recovery: "#c62828", handshake: "#f2b134",
    receive: "#f59e63", peer: "#4aa564", local_read: "#8fd19e", think: "#2e7d4f",
  };
  const layerColors = ["#4aa564", "#e8833a", "#3b7dd8"];
  const retransColor = "#c62828";
  const fmtMs = (v) => (v === 0 ? "0" : v >= 100 ? v.toFixed(0) + " ms" : v >= 1 ? v.toPrecision(3) + " ms" : (v * 1000).toPrecision(3) + " µs");
  const fmtCount = (n) => n.toLocaleString("en-US");
  const zip = (t, v) => t.map((x, i) => [x, v[i]]);
  const drawn = (kept, of, what) =>
    kept < of ? `${fmtCount(kept)} of ${fmtCount(of)} ${what} drawn: each interval's lowest and highest kept` : `${fmtCount(of)} ${what}`;

  const base = (title, subtext) => ({
    animation: false,
    title: { text: title, subtext: subtext, left: 10, top: 6, textStyle: { fontSize: 14 }, subtextStyle: { fontSize: 11 } },
    tooltip: { trigger: "item", confine: true },
    legend: { bottom: 4, left: "center", type: "scroll" },
    grid: { left: 64, right: 64, top: 64, bottom: 56 },
  });
  const timeAxis = { type: "value", name: "s", nameLocation: "end", scale: true, axisLabel: { formatter: (v) => v.toFixed(1) } };
  const msAxis = (name) => ({ type: "value", name: name || "ms", axisLabel: { formatter: (v) => fmtMs(v) } });
  const zoom = [{ type: "inside", filterMode: "none" }];

  const builders = {
    // Latency over time, stacked by component, with the retransmissions
    // and the pair's p50 and p99 as lines.
    timeline(p) {
      const tl = p.timeline;
      const series = tl.names.map((name, k) => ({
        name, type: "line", stack: "latency", areaStyle: { opacity: 0.85 }, lineStyle: { width: 0.5 },
        showSymbol: false, color: colors[name], data: zip(tl.t, tl.parts[k]),
        markLine: k === 0 ? {
          silent: true, symbol: "none", lineStyle: { color: "#333", type: "dashed" },
          label: { formatter: (x) => x.name + " " + fmtMs(x.value), position: "insideEndTop" },
          data: [{ name: "p50", yAxis: tl.p50 }, { name: "p99", yAxis: tl.p99 }],
        } : undefined,
      }));
      series.push({
        name: "retransmissions", type: "scatter", symbol: "triangle", symbolSize: 10, color: retransColor, z: 10,
        data: tl.retrans.map((r) => ({ value: [r[0], r[1]], retrans: r[2] })),
        tooltip: { formatter: (x) => `${x.data.retrans} retransmission(s) at ${x.value[0].toFixed(3)} s; exchange ${fmtMs(x.value[1])}` },
      });
      return Object.assign(base("Latency over time, by component", drawn(tl.t.length, tl.of, "exchanges") +
        (tl.retrans_of ? `; ${fmtCount(tl.retrans_of)} retransmitted (▲)` : "")), {
        tooltip: { trigger: "axis", confine: true, valueFormatter: (v) => (typeof v === "number" ? fmtMs(v) : v) },
        xAxis: timeAxis, yAxis: msAxis(), series, dataZoom: zoom,
      });
    },
    // Seed 004's three layers side by side, over time.
    layers(p) {
      const series = p.layers.map((xy, i) => ({
        name: p.boxes[i].name, type: "line", showSymbol: xy.t.length < 60, symbolSize: 4, color: layerColors[i],
        lineStyle: { width: 1.2 }, data: zip(xy.t, xy.v),
      }));
      const sub = p.layers.map((xy, i) => `${p.boxes[i].name.split(" (")[0]}: ${drawn(xy.t.length, xy.of, "points")}`).join(" · ");
      return Object.assign(base("App vs TCP vs network RTT over time", sub), {
        tooltip: { trigger: "axis", confine: true, valueFormatter: (v) => fmtMs(v) },
        xAxis: timeAxis, yAxis: msAxis(), series, dataZoom: zoom,
      });
    },
    "layer-box"(p) { return boxChart("App vs TCP vs network RTT", "every exchange: min, quartiles, max; ◆ p99", p.boxes, layerColors); },
    "component-box"(p) {
      return boxChart("Where the time goes, per component", "every exchange: min, quartiles, max; ◆ p99",
        p.component_boxes, p.component_boxes.map((b) => colors[b.name]));
    },
    cdf(p) {
      const positive = p.cdfs.every((c) => c.points.every((x) => x[0] > 0));
      const series = p.cdfs.map((c, i) => ({
        name: c.name, type: "line", step: "end", showSymbol: false, color: layerColors[i], data: c.points,
        markPoint: c.points.length ? {
          symbol: "pin", symbolSize: 34, label: { fontSize: 9, formatter: "p99" },
          data: [{ name: "p99 " + fmtMs(c.p99), coord: [c.p99, 0.99] }],
        } : undefined,
      }));
      return Object.assign(base("CDF of app, TCP and network RTT", "every exchange; the tail's quantiles and the max always drawn"), {
        tooltip: { trigger: "axis", confine: true, formatter: cdfTip },
        xAxis: Object.assign(msAxis(), { type: positive ? "log" : "value", scale: true }),
        yAxis: { type: "value", min: 0, max: 1, name: "fraction ≤ x" },
        series, dataZoom: [{ type: "inside", xAxisIndex: 0, filterMode: "none" }],
      });
    },
    turns(p) {
      const last = p.turns.length - 1;
      const cats = p.turns.map((_, i) => (i === last && i >= 20 ? i + "+" : String(i)));
      return Object.assign(base("Turns per exchange", "changes of direction; a plain request/response is 2"), {
        xAxis: { type: "category", data: cats, name: "turns" },
        yAxis: { type: "value", name: "exchanges" },
        series: [{ name: "exchanges", type: "bar", color: "#6b7a8f", data: p.turns }],
        legend: { show: false },
      });
    },
    // Each drawn connection's cwnd (left axis) and srtt (right axis), with
    // its retransmissions on its cwnd line.
    cwnd(p) {
      const series = [];
      const palette = ["#3b7dd8", "#8e44ad", "#16a085", "#d35400", "#2c3e50", "#c0392b"];
      p.flows.forEach((f, i) => {
        const c = palette[i % palette.length];
        const short = p.flows.length > 1 ? ` #${i + 1}` : "";
        series.push({ name: "cwnd" + short, type: "line", step: "end", showSymbol: false, color: c, data: zip(f.cwnd.t, f.cwnd.v), yAxisIndex: 0, flow: f.name });
        series.push({ name: "srtt" + short, type: "line", showSymbol: false, color: c, lineStyle: { type: "dashed", width: 1 }, data: zip(f.srtt.t, f.srtt.v), yAxisIndex: 1, flow: f.name });
      });
      series.push({
        name: "retransmissions", type: "scatter", symbol: "triangle", symbolSize: 10, color: retransColor, z: 10, yAxisIndex: 0,
        data: p.flows.flatMap((f) => f.retrans.map((r) => ({ value: [r[0], r[1]], retrans: r[2] }))),
        tooltip: { formatter: (x) => `${x.data.retrans} retransmission(s) at ${x.value[0].toFixed(3)} s, cwnd ${x.value[1]}` },
      });
      const sub = p.flows.length
        ? `${p.flows.length} of ${p.flows_of} connection(s), the most sampled: ` + p.flows.map((f, i) => `#${i + 1} ${f.label}`).join(", ")
        : "no RTT/cwnd samples for this pair";
      return Object.assign(base("cwnd and srtt over time, with retransmissions", sub), {
        tooltip: { trigger: "axis", confine: true },
        xAxis: timeAxis,
        yAxis: [{ type: "value", name: "cwnd (segments)" }, Object.assign(msAxis("srtt"), { splitLine: { show: false } })],
        series, dataZoom: zoom,
      });
    },
  };

  function boxChart(title, sub, boxes, boxColors) {
    return Object.assign(base(title, sub), {
      legend: { show: false },
      tooltip: { trigger: "item", confine: true, formatter: boxTip(boxes) },
      xAxis: { type: "category", data: boxes.map((b) => b.name), axisLabel: { interval: 0, fontSize: 11 } },
      yAxis: msAxis(),
      series: [
        {
          name: "distribution", type: "boxplot",
          data: boxes.map((b, i) => ({ value: [b.min, b.q1, b.median, b.q3, b.max], itemStyle: { color: hexA(boxColors[i], 0.25), borderColor: boxColors[i] } })),
        },
        { name: "p99", type: "scatter", symbol: "diamond", symbolSize: 11, color: "#222", data: boxes.map((b, i) => [i, b.p99]) },
      ],
    });
  }
  function boxTip(boxes) {
    return (x) => {
      const b = boxes[x.dataIndex];
      return `<b>${b.name}</b> (${fmtCount(b.count)})<br>max ${fmtMs(b.max)}<br>p99 ${fmtMs(b.p99)}<br>q3 ${fmtMs(b.q3)}<br>` +
        `median ${fmtMs(b.median)}<br>q1 ${fmtMs(b.q1)}<br>min ${fmtMs(b.min)}<br>mean ${fmtMs(b.mean)}`;
    };
  }
  function cdfTip(items) {
    return items.map((x) => `${x.marker}${x.seriesName}: ${(100 * x.value[1]).toFixed(2)} % ≤ ${fmtMs(x.value[0])}`).join("<br>");
  }
  function hexA(hex, a) {
    const n = parseInt(hex.slice(1), 16);
    return `rgba(${n >> 16},${(n >> 8) & 255},${n & 255},${a})`;
  }

  for (const el of document.querySelectorAll(".chart[data-chart]")) {
    const kind = el.dataset.chart;
    const pair = Number(el.dataset.pair);
    try {
      const chart = echarts.init(el, null, { renderer: "canvas" });
      chart.setOption(builders[kind](M.pairs[pair]));
      report.charts.push({ pair, kind, chart });
    } catch (err) {
      report.errors.push(`${kind} of pair ${pair}: ${err}`);
      console.error("lattrace report:", kind, "of pair", pair, err);
    }
  }
  window.addEventListener("resize", () => report.charts.forEach((c) => c.chart.resize()));

  // What each chart holds, for tests: series with their type and points.
  report.describe = () =>
    report.charts.map((c) => ({
      pair: c.pair,
      kind: c.kind,
      series: c.chart.getOption().series.map((s) => ({
        name: s.name, type: s.type, points: (s.data || []).length,
        // A bar's values, summed: how many exchanges a histogram holds.
        total: s.type === "bar" ? s.data.reduce((a, b) => a + b, 0) : undefined,
      })),
    }));
  report.ready = true;
})();
