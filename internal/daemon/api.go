package daemon

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/reply"
)

// Handler is kilnd's API. Over TCP (tcp set) every request needs the
// token; on the unix socket the socket's mode keeps others out.
func (d *Daemon) Handler(tcp bool) http.Handler {
	m := http.NewServeMux()
	m.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		reply.JSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	m.HandleFunc("POST /sandboxes", d.createHandler)
	m.HandleFunc("GET /sandboxes", func(w http.ResponseWriter, r *http.Request) {
		reply.JSON(w, http.StatusOK, d.List())
	})
	m.HandleFunc("GET /sandboxes/{id}", func(w http.ResponseWriter, r *http.Request) {
		e, err := d.get(r.PathValue("id"))
		if err != nil {
			writeError(w, err)
			return
		}
		reply.JSON(w, http.StatusOK, d.infoOf(e))
	})
	m.HandleFunc("DELETE /sandboxes/{id}", func(w http.ResponseWriter, r *http.Request) {
		removeLogs, err := strconv.ParseBool(defaultString(r.URL.Query().Get("remove_logs"), "false"))
		if err != nil {
			writeError(w, fmt.Errorf("%w: remove_logs must be true or false", errInvalid))
			return
		}
		if err := d.Delete(r.PathValue("id"), removeLogs); err != nil {
			writeError(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	m.HandleFunc("GET /sandboxes/{id}/logs", d.listLogs)
	m.HandleFunc("GET /sandboxes/{id}/logs/{pid}", d.readLog)
	for _, p := range []string{"/sandboxes/{id}/exec", "/sandboxes/{id}/exec-stream", "/sandboxes/{id}/exec-stream/"} {
		m.HandleFunc(p, d.forward)
	}
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		reply.Error(w, api.CodeNotFound, fmt.Sprintf("kilnd: no route %s %s", r.Method, r.URL.Path))
	})
	var h http.Handler = m
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !d.originAllowed(r) {
			reply.Error(w, api.CodeForbidden, "kilnd: origin "+clip(r.Header.Get("Origin"))+" is not allowed (see --allow-origin)")
			return
		}
		if tcp && !d.authorized(r) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="kilnd"`)
			reply.Error(w, api.CodeUnauthorized, "kilnd: a bearer token is required (the token file in kilnd's state directory)")
			return
		}
		h.ServeHTTP(w, r)
	})
}

func defaultString(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// writeError maps kilnd's error classes to the API's.
func writeError(w http.ResponseWriter, err error) {
	code := api.CodeInternal
	var maxErr *http.MaxBytesError
	switch {
	case errors.As(err, &maxErr):
		code = api.CodeTooLarge
	case errors.Is(err, errInvalid):
		code = api.CodeInvalid
	case errors.Is(err, errNotFound):
		code = api.CodeNotFound
	case errors.Is(err, errUnavailable):
		code = api.CodeUnavailable
	}
	reply.Error(w, code, err.Error())
}

func (d *Daemon) createHandler(w http.ResponseWriter, r *http.Request) {
	var req CreateRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, api.MaxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil && !errors.Is(err, io.EOF) {
		var maxErr *http.MaxBytesError
		if errors.As(err, &maxErr) {
			writeError(w, err)
			return
		}
		writeError(w, fmt.Errorf("%w: %v", errInvalid, err))
		return
	}
	info, err := d.Create(r.Context(), req)
	if err != nil {
		writeError(w, err)
		return
	}
	reply.JSON(w, http.StatusOK, info)
}

// forward sends a process call to the sandbox's agent.
func (d *Daemon) forward(w http.ResponseWriter, r *http.Request) {
	e, err := d.get(r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	d.mu.Lock()
	p, id, state := e.proxy, e.rec.ID, e.rec.State
	e.inflight++
	e.lastUsed = time.Now()
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		e.inflight--
		e.lastUsed = time.Now()
		d.mu.Unlock()
	}()
	if p == nil {
		writeError(w, fmt.Errorf("%w: sandbox %s is %s", errUnavailable, id, state))
		return
	}
	p.ServeHTTP(w, r)
}
