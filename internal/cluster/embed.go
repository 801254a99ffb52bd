package cluster

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Embedded is a NATS server kilnd runs in its own process (kilnd
// --cluster embedded): for tests and fleets of a few nodes, each kilnd
// one server of the NATS cluster. Production runs NATS on its own.
type Embedded struct {
	// StoreDir holds its JetStream data.
	StoreDir string
	// Listen is its client address (other tools, other kilnds may
	// connect there); RouteListen its cluster route address, empty for a
	// server of its own.
	Listen, RouteListen string
	// Routes are the route URLs of the other servers.
	Routes []string
	// Token, when set, is the token clients and routes must present.
	Token string
}

// embeddedCluster names the NATS cluster the embedded servers form.
const embeddedCluster = "sandkiln"

// start runs e as server name and waits until it takes connections.
func (e *Embedded) start(name string) (*server.Server, error) {
	host, port, err := splitHostPort(e.Listen, "--cluster-listen")
	if err != nil {
		return nil, err
	}
	opts := &server.Options{
		ServerName: name,
		Host:       host,
		Port:       port,
		JetStream:  true,
		StoreDir:   e.StoreDir,
		NoSigs:     true,
		NoLog:      true,
		// Its own HTTP monitoring stays off: kilnd's API is the window.
		HTTPPort: 0,
	}
	if e.Token != "" {
		opts.Authorization = e.Token
	}
	if e.RouteListen != "" {
		rh, rp, err := splitHostPort(e.RouteListen, "--cluster-route-listen")
		if err != nil {
			return nil, err
		}
		opts.Cluster = server.ClusterOpts{Name: embeddedCluster, Host: rh, Port: rp}
		if e.Token != "" {
			opts.Cluster.Username, opts.Cluster.Password = "kiln", e.Token
		}
		for _, r := range e.Routes {
			u, err := url.Parse(r)
			if err != nil || u.Host == "" || u.Scheme != "nats-route" && u.Scheme != "nats" {
				return nil, fmt.Errorf("cluster: --cluster-routes %q: want URLs such as nats-route://10.0.0.2:6222", r)
			}
			u.Scheme = "nats-route"
			if e.Token != "" && u.User == nil {
				u.User = url.UserPassword("kiln", e.Token)
			}
			opts.Routes = append(opts.Routes, u)
		}
	} else if len(e.Routes) > 0 {
		return nil, fmt.Errorf("cluster: --cluster-routes needs --cluster-route-listen")
	}
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("cluster: embedded NATS server: %w", err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		return nil, fmt.Errorf("cluster: embedded NATS server did not start listening on %s", e.Listen)
	}
	return s, nil
}

func splitHostPort(addr, flag string) (string, int, error) {
	host, p, err := net.SplitHostPort(addr)
	if err == nil {
		port, perr := strconv.Atoi(p)
		if perr == nil && port >= -1 && port < 65536 {
			return host, port, nil
		}
	}
	return "", 0, fmt.Errorf("cluster: %s %q: want HOST:PORT, such as 127.0.0.1:4222", flag, addr)
}
