package daemon

import (
	"bufio"
	"context"
	"io"
	"maps"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/outexport"
	"github.com/sandkiln/sandkiln/internal/sandbox"
	"github.com/sandkiln/sandkiln/internal/version"
)

// metrics are kilnd's Prometheus figures, in a registry of its own.
type metrics struct {
	handler  http.Handler
	requests *prometheus.HistogramVec
	creates  prometheus.Histogram
	// warmTaken counts the creates that took a sandbox made ahead.
	warmTaken prometheus.Counter
	stopped   *prometheus.CounterVec
	files     *prometheus.CounterVec
	// started counts process starts the agents answered with success,
	// by kind; relayed WebSockets, by what they reach, opened and open.
	started  *prometheus.CounterVec
	wsOpened *prometheus.CounterVec
	wsOpen   *prometheus.GaugeVec
}

// Kinds of process start (the route the start came by).
const (
	startExec       = "exec"
	startExecStream = "exec_stream"
)

// What a relayed WebSocket reaches, from its path at the agent.
const (
	wsOutput = "output" // a process's output: a watcher
	wsFiles  = "files"  // a watch of the sandbox's files
	wsTCP    = "tcp"    // a port forwarded
	wsPort   = "port"   // an app's own WebSocket, through a port's proxy
	wsOther  = "other"
)

// wsKind says what the WebSocket to the agent's path p reaches.
func wsKind(p string) string {
	switch {
	case strings.HasPrefix(p, "/exec-stream/") && strings.HasSuffix(p, "/logs"):
		return wsOutput
	case strings.HasPrefix(p, "/files/"):
		return wsFiles
	case strings.HasPrefix(p, "/tcp/"):
		return wsTCP
	case strings.HasPrefix(p, "/ports/"):
		return wsPort
	}
	return wsOther
}

func newMetrics(d *Daemon) *metrics {
	reg := prometheus.NewRegistry()
	m := &metrics{
		requests: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kilnd_api_request_duration_seconds",
			Help:    "Time kilnd took to answer API requests, by route (the pattern matched, \"none\" for a request that no pattern matched or that was refused before routing), method (OTHER for a method HTTP does not define) and status code; a WebSocket is counted when it switches protocols (code 101), the time until then.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 4, 10),
		}, []string{"route", "method", "code"}),
		creates: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "kilnd_sandbox_create_seconds", Help: "Time from a create request to a sandbox whose agent answers.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
		warmTaken: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kilnd_sandbox_creates_made_ahead_total",
			Help: "Creates that took a sandbox made ahead (kilnd --warm) rather than waiting for one to start.",
		}),
		stopped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kilnd_sandboxes_ended_total", Help: "Sandboxes that stopped or were deleted, by how.",
		}, []string{"how"}),
		files: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kilnd_file_transfers_total", Help: "Files read (GET) or written (PUT) through kilnd, by method and how: handed over by the agent to kilnd, or proxied.",
		}, []string{"method", "how"}),
		started: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kilnd_processes_started_total",
			Help: "Processes started through kilnd, counted when the sandbox's agent answered the start with success, by kind: exec (run to its end; its answer comes when it has ended) or exec_stream (detached).",
		}, []string{"kind"}),
		wsOpened: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kilnd_relayed_websockets_opened_total",
			Help: "WebSockets kilnd relayed to a sandbox's agent, counted when the agent switched protocols, by what they reach: output (a watcher of a process's output), files (a file watch), tcp (a port forwarded), port (an app's WebSocket), other.",
		}, []string{"kind"}),
		wsOpen: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kilnd_relayed_websockets",
			Help: "WebSockets kilnd relays to sandboxes' agents now, by what they reach (as kilnd_relayed_websockets_opened_total).",
		}, []string{"kind"}),
	}
	for _, how := range []string{"stopped", "deleted"} {
		m.stopped.WithLabelValues(how)
	}
	for _, method := range []string{"GET", "PUT"} {
		for _, how := range []string{"handover", "proxy"} {
			m.files.WithLabelValues(method, how)
		}
	}
	for _, kind := range []string{startExec, startExecStream} {
		m.started.WithLabelValues(kind)
	}
	for _, kind := range []string{wsOutput, wsFiles, wsTCP, wsPort, wsOther} {
		m.wsOpened.WithLabelValues(kind)
		m.wsOpen.WithLabelValues(kind)
	}
	sandboxes := prometheus.NewDesc("kilnd_sandboxes", "Sandboxes known to kilnd, by state.", []string{"state"}, nil)
	madeAhead := prometheus.NewDesc("kilnd_sandboxes_made_ahead", "Sandboxes made ahead (kilnd --warm) and not yet taken by a create, by runtime.", []string{"runtime"}, nil)
	reg.MustRegister(collectorFunc{descs: []*prometheus.Desc{madeAhead}, collect: func(ch chan<- prometheus.Metric) {
		for _, rt := range d.warmRuntimes() {
			ch <- prometheus.MustNewConstMetric(madeAhead, prometheus.GaugeValue, float64(d.warm.count(rt)), rt)
		}
	}})
	reg.MustRegister(clusterCollector(d))
	reg.MustRegister(m.requests, m.creates, m.warmTaken, m.stopped, m.files, m.started, m.wsOpened, m.wsOpen,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		buildInfo(),
		collectorFunc{descs: []*prometheus.Desc{sandboxes}, collect: func(ch chan<- prometheus.Metric) {
			counts := map[string]int{StateRunning: 0, api.SandboxPaused: 0, StateStopped: 0, StateDeleted: 0}
			d.mu.Lock()
			for _, e := range d.sandboxes {
				counts[stateOf(e.rec)]++
			}
			d.mu.Unlock()
			for state, n := range counts {
				ch <- prometheus.MustNewConstMetric(sandboxes, prometheus.GaugeValue, float64(n), state)
			}
		}},
		sandboxCollector(d), sandboxInfo(d))
	m.handler = promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	return m
}

// sandboxInfo is kilnd_sandbox_info: a series of value 1 for each
// sandbox not deleted, labelled with what people know it by (its id as
// sandbox, as every per-sandbox series has it, its name, image, runtime
// and state) and each of its labels as label_KEY, so that a query joins
// names and labels to any per-sandbox series:
//
//	kilnd_sandbox_memory_bytes * on(sandbox) group_left(name) kilnd_sandbox_info
//
// Each scrape's series all carry the labels' keys of every sandbox (empty
// where one has not that label), as a metric family's series must; a key
// whose name in Prometheus's alphabet another key has already taken gets
// _2, _3, … after it. It describes nothing ahead, since its labels change
// with the sandboxes.
func sandboxInfo(d *Daemon) prometheus.Collector {
	return collectorFunc{collect: func(ch chan<- prometheus.Metric) {
		d.mu.Lock()
		recs := make([]record, 0, len(d.live))
		for _, id := range d.live {
			recs = append(recs, d.sandboxes[id].rec)
		}
		d.mu.Unlock()
		keys := map[string]bool{}
		for _, rec := range recs {
			for k := range rec.Labels {
				keys[k] = true
			}
		}
		names := []string{"sandbox", "name", "image", "runtime", "state"}
		taken := map[string]bool{}
		for _, n := range names {
			taken[n] = true
		}
		sorted := slices.Sorted(maps.Keys(keys))
		for _, k := range sorted {
			n := "label_" + strings.Map(func(r rune) rune {
				if isAlnum(r) || r == '_' {
					return r
				}
				return '_'
			}, k)
			for i, base := 2, n; taken[n]; i++ {
				n = base + "_" + strconv.Itoa(i)
			}
			taken[n] = true
			names = append(names, n)
		}
		desc := prometheus.NewDesc("kilnd_sandbox_info", "A sandbox not deleted, by what people know it by: its id (sandbox), name, image, runtime, state and its labels (label_KEY); always 1.", names, nil)
		for _, rec := range recs {
			values := []string{rec.ID, rec.Name, rec.Image, runtimeOf(rec), stateOf(rec)}
			for _, k := range sorted {
				values = append(values, rec.Labels[k])
			}
			ch <- prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, 1, values...)
		}
	}}
}

// buildInfo is kilnd_build_info: which kilnd this is, as GET /version
// says.
func buildInfo() prometheus.Collector {
	v := version.Get()
	revision := v.Revision
	if revision == "" {
		revision = "unknown"
	}
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        "kilnd_build_info",
		Help:        "Always 1; its labels say which kilnd this is: its module version (devel when built from a work tree), Go version and VCS revision.",
		ConstLabels: prometheus.Labels{"version": v.Version, "goversion": v.GoVersion, "revision": revision},
	}, func() float64 { return 1 })
}

// sandboxCollector reads each running sandbox's cgroups at every scrape:
// nothing polls between scrapes. A figure a sandbox's cgroups do not keep
// on this host (see sandbox.Stats) has no series.
// It is long because it is a table: each metric's name, help and labels
// beside the figure it reads, as promtool and a scrape show them.
func sandboxCollector(d *Daemon) prometheus.Collector {
	label := []string{"sandbox"}
	cpu := prometheus.NewDesc("kilnd_sandbox_cpu_seconds_total", "CPU time a running sandbox's processes, its agent among them, have used, from its cgroup.", label, nil)
	mem := prometheus.NewDesc("kilnd_sandbox_memory_bytes", "Memory a running sandbox's processes use now, from its memory cgroup (v1 memory.usage_in_bytes, v2 memory.current).", label, nil)
	peak := prometheus.NewDesc("kilnd_sandbox_memory_peak_bytes", "The most memory a running sandbox's processes have used at once (v1 memory.max_usage_in_bytes, v2 memory.peak).", label, nil)
	memLimit := prometheus.NewDesc("kilnd_sandbox_memory_limit_bytes", "A running sandbox's memory limit; no series without one.", label, nil)
	pids := prometheus.NewDesc("kilnd_sandbox_pids", "Tasks (threads included) in a running sandbox's pids cgroup now.", label, nil)
	pidsLimit := prometheus.NewDesc("kilnd_sandbox_pids_limit", "A running sandbox's limit of tasks; no series without one.", label, nil)
	ooms := prometheus.NewDesc("kilnd_sandbox_oom_kills_total", "Processes the kernel's out-of-memory killer ended in a running sandbox's memory cgroup.", label, nil)
	// What each sandbox's agent counted, since the sandbox started.
	started := prometheus.NewDesc("kilnd_sandbox_processes_started_total", "Processes a running sandbox's agent has started, as it counts them.", label, nil)
	exited := prometheus.NewDesc("kilnd_sandbox_processes_exited_total", "Processes of a running sandbox that have finished (exited, their output drained), by outcome: exit_zero, exit_nonzero or signal, as its agent counts them.", []string{"sandbox", "outcome"}, nil)
	written := prometheus.NewDesc("kilnd_sandbox_capture_written_bytes_total", "Bytes of finished captured processes' output a running sandbox's captured logs hold, as its agent counts them.", label, nil)
	dropped := prometheus.NewDesc("kilnd_sandbox_capture_dropped_bytes_total", "Bytes of finished captured processes' output their captured logs lost (a full queue, a failed write), as a running sandbox's agent counts them.", label, nil)
	watchers := prometheus.NewDesc("kilnd_sandbox_watchers_attached_total", "Readers of a process's output a running sandbox's agent has served (WebSocket watchers and plain reads).", label, nil)
	gaps := prometheus.NewDesc("kilnd_sandbox_watcher_gaps_total", "Gaps a running sandbox's agent told its watchers of: output evicted before they read it.", label, nil)
	lost := prometheus.NewDesc("kilnd_sandbox_watcher_lost_bytes_total", "Bytes of output a running sandbox's agent told its watchers they lost, in those gaps.", label, nil)
	diskUsed := prometheus.NewDesc("kilnd_sandbox_disk_used_bytes", "Bytes used of a running sandbox's own disk (its /workspace and writable layer), as its agent reads it; no series without one.", label, nil)
	diskSize := prometheus.NewDesc("kilnd_sandbox_disk_size_bytes", "The size of a running sandbox's own disk (its quota); no series without one.", label, nil)
	return collectorFunc{descs: []*prometheus.Desc{cpu, mem, peak, memLimit, pids, pidsLimit, ooms, started, exited, written, dropped, watchers, gaps, lost, diskUsed, diskSize}, collect: func(ch chan<- prometheus.Metric) {
		type running struct {
			id string
			sb sandbox.Instance
			t  http.RoundTripper // to its agent; nil while it has none
		}
		var list []running
		d.mu.Lock()
		for id, e := range d.sandboxes {
			if e.rec.State == StateRunning && !e.deleting && e.sb != nil {
				r := running{id: id, sb: e.sb}
				if e.proxy != nil && !e.agentPaused() {
					r.t = e.proxy.Transport
				}
				list = append(list, r)
			}
		}
		d.mu.Unlock()
		// Read outside the lock, a few sandboxes at a time: what their
		// agents counted, and their stats (a gVisor sandbox's agent is
		// asked for part of those too), each question within
		// agentListTimeout.
		counts := make([]*api.AgentCounts, len(list))
		stats := make([]*sandbox.Stats, len(list))
		fewAtATime(len(list), func(i int) {
			if list[i].t != nil {
				counts[i] = agentCounts(context.Background(), list[i].t)
			}
			if st, err := list[i].sb.Stats(); err == nil {
				stats[i] = &st
			}
		})
		for i, r := range list {
			if c := counts[i]; c != nil {
				for _, f := range []struct {
					desc   *prometheus.Desc
					v      int64
					labels []string
				}{
					{started, c.ProcessesStarted, nil},
					{exited, c.ExitedZero, []string{"exit_zero"}},
					{exited, c.ExitedNonZero, []string{"exit_nonzero"}},
					{exited, c.Signaled, []string{"signal"}},
					{written, c.CaptureWrittenBytes, nil},
					{dropped, c.CaptureDroppedBytes, nil},
					{watchers, c.WatchersAttached, nil},
					{gaps, c.WatcherGaps, nil},
					{lost, c.WatcherLostBytes, nil},
				} {
					ch <- prometheus.MustNewConstMetric(f.desc, prometheus.CounterValue, float64(max(f.v, 0)), append([]string{r.id}, f.labels...)...)
				}
				if c.DiskUsedBytes != nil && c.DiskSizeBytes != nil {
					ch <- prometheus.MustNewConstMetric(diskUsed, prometheus.GaugeValue, float64(max(*c.DiskUsedBytes, 0)), r.id)
					ch <- prometheus.MustNewConstMetric(diskSize, prometheus.GaugeValue, float64(max(*c.DiskSizeBytes, 0)), r.id)
				}
			}
			st := stats[i]
			if st == nil {
				continue // ended since: it is running no more
			}
			ch <- prometheus.MustNewConstMetric(cpu, prometheus.CounterValue, st.CPUSeconds, r.id)
			for _, f := range []struct {
				desc *prometheus.Desc
				kind prometheus.ValueType
				v    *int64
			}{
				{mem, prometheus.GaugeValue, st.MemoryBytes},
				{peak, prometheus.GaugeValue, st.MemoryPeakBytes},
				{memLimit, prometheus.GaugeValue, st.MemoryLimitBytes},
				{pids, prometheus.GaugeValue, st.Pids},
				{pidsLimit, prometheus.GaugeValue, st.PidsLimit},
				{ooms, prometheus.CounterValue, st.OOMKills},
			} {
				if f.v != nil {
					ch <- prometheus.MustNewConstMetric(f.desc, f.kind, float64(*f.v), r.id)
				}
			}
		}
	}}
}

// maxAgentQuestions bounds the sandboxes one scrape reads at once.
const maxAgentQuestions = 16

// fewAtATime calls f with each index below n, maxAgentQuestions at a
// time, and returns once every call has.
func fewAtATime(n int, f func(i int)) {
	sem := make(chan struct{}, maxAgentQuestions)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			f(i)
		})
	}
	wg.Wait()
}

// instrument times every request kilnd answers, by the route its mux
// matched (r.Pattern, which the mux sets on the request it routes).
func (m *metrics) instrument(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ow := &observedWriter{ResponseWriter: w}
		began := time.Now()
		ow.observe = func(code int) {
			route := r.Pattern // set by mux once it routed r
			if route == "" {
				route = "none"
			}
			m.requests.WithLabelValues(route, methodLabel(r.Method), strconv.Itoa(code)).Observe(time.Since(began).Seconds())
		}
		h.ServeHTTP(ow, r)
		ow.done()
	})
}

// methodLabel is a request's method as a label: a client may send any
// token as a method, and each would be a series of its own.
func methodLabel(m string) string {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodOptions, http.MethodConnect, http.MethodTrace:
		return m
	}
	return "OTHER"
}

// observedWriter reports a request's status once: when a WebSocket
// switches protocols (WriteHeader(101), or the connection hijacked to
// write its own switch), since a hijacked connection's handler returns
// only when it closes; otherwise when the handler returns.
type observedWriter struct {
	http.ResponseWriter
	observe  func(code int)
	code     int // the status written; 0 before
	observed bool
}

func (w *observedWriter) WriteHeader(code int) {
	if code == http.StatusSwitchingProtocols {
		w.report(code)
	} else if w.code == 0 && code >= 200 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *observedWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// ReadFrom keeps the server's own ReadFrom, its sendfile, for the files
// kilnd hands out.
func (w *observedWriter) ReadFrom(r io.Reader) (int64, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return io.Copy(w.ResponseWriter, r)
}

// Hijack is only ever asked for to switch protocols, the hijacker writing
// the 101 itself.
func (w *observedWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, brw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err == nil {
		w.report(http.StatusSwitchingProtocols)
	}
	return conn, brw, err
}

// Unwrap gives http.ResponseController the writer's other methods.
func (w *observedWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *observedWriter) report(code int) {
	if !w.observed {
		w.observed = true
		w.observe(code)
	}
}

// done reports the status when nothing did before: the handler returned.
func (w *observedWriter) done() {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	w.report(w.code)
}

type collectorFunc struct {
	descs   []*prometheus.Desc
	collect func(chan<- prometheus.Metric)
}

func (c collectorFunc) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}
func (c collectorFunc) Collect(ch chan<- prometheus.Metric) { c.collect(ch) }

// clusterCollector reports, on a kilnd in a cluster, whether the cluster
// is reached, its nodes by state, and what the export of this node's
// output has done: a lost-bytes counter that grows says the export falls
// behind its processes' rings.
func clusterCollector(d *Daemon) prometheus.Collector {
	connected := prometheus.NewDesc("kilnd_cluster_connected", "1 while this kilnd reaches its cluster (kilnd --cluster), 0 while the cluster is down.", nil, nil)
	nodes := prometheus.NewDesc("kilnd_cluster_nodes", "The cluster's nodes, by state, as this kilnd sees them.", []string{"state"}, nil)
	following := prometheus.NewDesc("kilnd_export_processes", "Processes whose output this kilnd exports to the cluster now.", nil, nil)
	type counter struct {
		desc *prometheus.Desc
		get  func(outexport.Stats) int64
	}
	counters := []counter{
		{prometheus.NewDesc("kilnd_export_messages_total", "Messages of processes' output stored in the cluster's JetStream.", nil, nil), func(s outexport.Stats) int64 { return s.Messages }},
		{prometheus.NewDesc("kilnd_export_bytes_total", "Bytes of processes' output stored in the cluster's JetStream.", nil, nil), func(s outexport.Stats) int64 { return s.Bytes }},
		{prometheus.NewDesc("kilnd_export_lost_bytes_total", "Bytes of processes' output that never reached the cluster (its gap records: the export fell behind, or the cluster was down).", nil, nil), func(s outexport.Stats) int64 { return s.Lost }},
		{prometheus.NewDesc("kilnd_export_retries_total", "Publishes of output tried again (JetStream unreachable, an election, a timeout).", nil, nil), func(s outexport.Stats) int64 { return s.Retries }},
		{prometheus.NewDesc("kilnd_export_fenced_total", "Processes whose export another writer of their subject holds (left to it).", nil, nil), func(s outexport.Stats) int64 { return s.Fenced }},
		{prometheus.NewDesc("kilnd_export_ended_total", "Processes whose output reached the cluster to its end.", nil, nil), func(s outexport.Stats) int64 { return s.Ended }},
	}
	descs := []*prometheus.Desc{connected, nodes, following}
	for _, c := range counters {
		descs = append(descs, c.desc)
	}
	events := eventCounters()
	for _, c := range events {
		descs = append(descs, c.desc)
	}
	return collectorFunc{descs: descs, collect: func(ch chan<- prometheus.Metric) {
		n := d.cluster
		if n == nil {
			return
		}
		up := 0.0
		if n.Status().State == "connected" {
			up = 1
		}
		ch <- prometheus.MustNewConstMetric(connected, prometheus.GaugeValue, up)
		counts := map[string]int{api.NodeReady: 0, api.NodeDraining: 0, api.NodeUnreachable: 0, api.NodeLost: 0}
		for _, node := range n.Nodes() {
			counts[node.State]++
		}
		for state, c := range counts {
			ch <- prometheus.MustNewConstMetric(nodes, prometheus.GaugeValue, float64(c), state)
		}
		if x := d.events.cluster; x != nil {
			st := x.Stats()
			for _, c := range events {
				ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(c.get(st)))
			}
		}
		if d.exporter == nil {
			return
		}
		st := d.exporter.Stats()
		ch <- prometheus.MustNewConstMetric(following, prometheus.GaugeValue, float64(st.Following))
		for _, c := range counters {
			ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(c.get(st)))
		}
	}}
}
