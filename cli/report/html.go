package report

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"html/template"
	"io"
	"math"
	"strings"
	"time"
)

// EChartsVersion is the vendored charting library (assets/echarts).
const EChartsVersion = "6.1.0"

var (
	//go:embed assets/echarts/echarts.min.js
	echartsJS string
	//go:embed report.html.tmpl
	pageTmpl string
	//go:embed report.js
	reportJS string
	//go:embed report.css
	reportCSS string
)

var page = template.Must(template.New("report").Funcs(template.FuncMap{
	"ms":       fmtMs,
	"pct":      func(part, total float64) string { return fmt.Sprintf("%.0f %%", 100*part/math.Max(total, 1e-12)) },
	"frac":     func(n, of int) string { return fmt.Sprintf("%.0f %%", 100*float64(n)/math.Max(float64(of), 1)) },
	"join":     strings.Join,
	"mb":       func(n int64) string { return fmt.Sprintf("%.1f MB", float64(n)/1e6) },
	"duration": func(d time.Duration) string { return d.Round(time.Millisecond).String() },
	"seconds": func(s float64) string {
		return (time.Duration(s * float64(time.Second))).Round(time.Millisecond).String()
	},
	"evidence": func(v float64, unit string) string {
		s := fmt.Sprintf("%.4g", v)
		if unit != "" && unit != "count" {
			s += " " + unit
		}
		return s
	},
}).Parse(pageTmpl))

// fmtMs shows a latency in ms with three significant digits.
func fmtMs(v float64) string {
	switch {
	case v == 0:
		return "0"
	case v >= 100:
		return fmt.Sprintf("%.0f ms", v)
	case v >= 10:
		return fmt.Sprintf("%.1f ms", v)
	case v >= 1:
		return fmt.Sprintf("%.2f ms", v)
	}
	return fmt.Sprintf("%.0f µs", v*1000)
}

// Write renders m as one self-contained HTML page: the charting library,
// the script and the data are all inside it.
func Write(w io.Writer, m *Model) error {
	data, err := json.Marshal(m)
	if err != nil {
		return err
	}
	// json.Marshal escapes <, > and &, so the data cannot end its script
	// element; the library and the script are ours and contain no
	// "</script".
	return page.Execute(w, struct {
		*Model
		Data, Lib, Script template.JS
		CSS               template.CSS
		LibVersion        string
	}{m, template.JS(data), template.JS(echartsJS), template.JS(reportJS), template.CSS(reportCSS), EChartsVersion})
}
