package daemon

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metrics are kilnd's Prometheus figures, in a registry of its own.
type metrics struct {
	handler  http.Handler
	requests *prometheus.CounterVec
	creates  prometheus.Histogram
	stopped  *prometheus.CounterVec
	files    *prometheus.CounterVec
}

func newMetrics(d *Daemon) *metrics {
	reg := prometheus.NewRegistry()
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kilnd_api_requests_total", Help: "API requests answered, by method and status code.",
		}, []string{"method", "code"}),
		creates: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "kilnd_sandbox_create_seconds", Help: "Time from a create request to a sandbox whose agent answers.",
			Buckets: prometheus.ExponentialBuckets(0.002, 2, 12),
		}),
		stopped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kilnd_sandboxes_ended_total", Help: "Sandboxes that stopped or were deleted, by how.",
		}, []string{"how"}),
		files: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kilnd_file_transfers_total", Help: "Files read (GET) or written (PUT) through kilnd, by method and how: handed over by the agent to kilnd, or proxied.",
		}, []string{"method", "how"}),
	}
	for _, method := range []string{"GET", "PUT"} {
		for _, how := range []string{"handover", "proxy"} {
			m.files.WithLabelValues(method, how)
		}
	}
	sandboxes := prometheus.NewDesc("kilnd_sandboxes", "Sandboxes known to kilnd, by state.", []string{"state"}, nil)
	reg.MustRegister(m.requests, m.creates, m.stopped, m.files,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		collectorFunc{desc: sandboxes, collect: func(ch chan<- prometheus.Metric) {
			counts := map[string]int{StateRunning: 0, StateStopped: 0, StateDeleted: 0}
			d.mu.Lock()
			for _, e := range d.sandboxes {
				counts[e.rec.State]++
			}
			d.mu.Unlock()
			for state, n := range counts {
				ch <- prometheus.MustNewConstMetric(sandboxes, prometheus.GaugeValue, float64(n), state)
			}
		}})
	m.handler = promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	return m
}

// instrument counts every answered request.
func (m *metrics) instrument(h http.Handler) http.Handler {
	return promhttp.InstrumentHandlerCounter(m.requests, h)
}

type collectorFunc struct {
	desc    *prometheus.Desc
	collect func(chan<- prometheus.Metric)
}

func (c collectorFunc) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }
func (c collectorFunc) Collect(ch chan<- prometheus.Metric) { c.collect(ch) }
