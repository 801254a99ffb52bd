package daemon

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/errdefs"
	"github.com/sandkiln/sandkiln/internal/reply"
)

// A preview is a URL of kilnd's that reaches one port of one sandbox
// without kilnd's token, on a host of its own named by the preview's id
// (see previewHost): the path carries a token of its own, which expires
// and can be revoked, and which reaches the preview on its own host
// alone. kilnd keeps only the token's hash, in the sandbox's record.
type preview struct {
	ID        string    `json:"id"`
	Port      int       `json:"port"`
	Hash      string    `json:"hash"` // hex SHA-256 of the token
	ExpiresAt time.Time `json:"expires_at"`
}

// Preview lifetimes, in seconds.
const (
	defaultPreviewTTL = 3600
	maxPreviewTTL     = 7 * 24 * 3600
	maxPreviews       = 64 // per sandbox
)

func tokenHash(token string) string {
	h := sha256.Sum256([]byte(token))
	return hex.EncodeToString(h[:])
}

// previewPrefix is where a preview's token is served, on its host.
const previewPrefix = "/preview/"

// newPreviewID is a preview id no preview of kilnd's has: 64 random bits,
// so that a preview's host, and the origin a browser keeps its storage
// and service workers by, is never one an earlier preview had. Called
// with mu held.
func (d *Daemon) newPreviewID() string {
	for {
		var raw [8]byte
		rand.Read(raw[:])
		id := hex.EncodeToString(raw[:])
		taken := false
		for _, e := range d.sandboxes {
			taken = taken || slices.ContainsFunc(e.rec.Previews, func(p preview) bool { return p.ID == id })
		}
		if !taken {
			return id
		}
	}
}

// createPreview serves POST /sandboxes/{id}/previews.
func (d *Daemon) createPreview(tcp bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req api.CreatePreview
		if err := decodeBody(w, r, &req); err != nil {
			reply.Error(w, err)
			return
		}
		if req.Port < 1 || req.Port > 65535 {
			reply.Error(w, fmt.Errorf("%w: port %d: want 1 to 65535", errdefs.ErrInvalidArgument, req.Port))
			return
		}
		ttl := req.TTLSeconds
		if ttl == 0 {
			ttl = defaultPreviewTTL
		}
		if ttl < 0 || ttl > maxPreviewTTL {
			reply.Error(w, fmt.Errorf("%w: ttl_seconds %d: 1 to %d (7 days)", errdefs.ErrInvalidArgument, ttl, maxPreviewTTL))
			return
		}
		authority, err := d.previewAuthority(r, tcp)
		if err != nil {
			reply.Error(w, err)
			return
		}
		e, err := d.get(r.PathValue("id"))
		if err != nil {
			reply.Error(w, err)
			return
		}
		var raw [32]byte
		rand.Read(raw[:])
		token := base64.RawURLEncoding.EncodeToString(raw[:])
		now := time.Now().UTC()
		p := preview{Port: req.Port, Hash: tokenHash(token), ExpiresAt: now.Add(time.Duration(ttl) * time.Second).Truncate(time.Second)}
		d.mu.Lock()
		if e.rec.State != StateRunning {
			d.mu.Unlock()
			reply.Error(w, fmt.Errorf("%w: sandbox %s is %s", errdefs.ErrFailedPrecondition, e.rec.ID, e.rec.State))
			return
		}
		p.ID = d.newPreviewID()
		e.rec.Previews = slices.DeleteFunc(e.rec.Previews, func(p preview) bool {
			if now.After(p.ExpiresAt) {
				delete(d.previews, p.Hash)
				return true
			}
			return false
		})
		if len(e.rec.Previews) >= maxPreviews {
			d.mu.Unlock()
			reply.Error(w, fmt.Errorf("%w: sandbox %s has %d previews: revoke one first", errdefs.ErrTooLarge, e.rec.ID, maxPreviews))
			return
		}
		e.rec.Previews = append(e.rec.Previews, p)
		err = d.save(e.rec)
		if err != nil {
			e.rec.Previews = e.rec.Previews[:len(e.rec.Previews)-1]
		} else {
			d.indexPreview(p.Hash, e.rec.ID)
		}
		id := e.rec.ID
		d.mu.Unlock()
		if err != nil {
			reply.Error(w, err)
			return
		}
		d.publishPreview(r.Context(), p.ID, id, p.ExpiresAt)
		reply.JSON(w, http.StatusCreated, api.Preview{ID: p.ID, Port: p.Port, URL: previewURL(p.ID, authority, token), Token: token, ExpiresAt: p.ExpiresAt})
	}
}

// previewURL is preview id's URL: its host, ID and authority (see
// previewAuthority), and its token's path.
func previewURL(id, authority, token string) string {
	return "http://" + id + authority + previewPrefix + token + "/"
}

// listPreviews serves GET /sandboxes/{id}/previews: the previews not
// expired, without their tokens.
func (d *Daemon) listPreviews(w http.ResponseWriter, r *http.Request) {
	e, err := d.get(r.PathValue("id"))
	if err != nil {
		reply.Error(w, err)
		return
	}
	now := time.Now()
	list := []api.Preview{}
	d.mu.Lock()
	for _, p := range e.rec.Previews {
		if now.Before(p.ExpiresAt) {
			list = append(list, api.Preview{ID: p.ID, Port: p.Port, ExpiresAt: p.ExpiresAt})
		}
	}
	d.mu.Unlock()
	reply.JSON(w, http.StatusOK, list)
}

// revokePreview serves DELETE /sandboxes/{id}/previews/{preview}.
func (d *Daemon) revokePreview(w http.ResponseWriter, r *http.Request) {
	e, err := d.get(r.PathValue("id"))
	if err != nil {
		reply.Error(w, err)
		return
	}
	revoked := ""
	defer func() { // once d.mu is let go
		if revoked != "" {
			d.forgetPreview(revoked)
		}
	}()
	d.mu.Lock()
	defer d.mu.Unlock()
	i := slices.IndexFunc(e.rec.Previews, func(p preview) bool { return p.ID == r.PathValue("preview") })
	if i < 0 {
		reply.Error(w, fmt.Errorf("%w: sandbox %s has no preview %q", errdefs.ErrNotFound, e.rec.ID, api.Clip(r.PathValue("preview"))))
		return
	}
	kept := e.rec
	kept.Previews = slices.Delete(slices.Clone(e.rec.Previews), i, i+1)
	if err := d.save(kept); err != nil {
		reply.Error(w, err)
		return
	}
	revoked = e.rec.Previews[i].ID
	delete(d.previews, e.rec.Previews[i].Hash)
	for _, cancel := range d.previewing[e.rec.Previews[i].Hash] {
		cancel()
	}
	e.rec = kept
	w.WriteHeader(http.StatusNoContent)
}

// servePreview serves /preview/{token}/{path...} on a preview's host:
// the token's sandbox and port, as /sandboxes/{id}/ports/{port}/{path...}
// would, without kilnd's token. A token unknown, expired or revoked, or
// another preview's than the host's, reaches nothing.
func (d *Daemon) servePreview(w http.ResponseWriter, r *http.Request) {
	host, _ := d.previewHost(r)
	d.servePreviewOf(w, r, host, false)
}

// servePreviewOf serves r as the host of preview host serves it: by this
// node, or in a cluster by the node that serves that preview, unless r
// came from another node (fromNode).
func (d *Daemon) servePreviewOf(w http.ResponseWriter, r *http.Request, host string, fromNode bool) {
	rest := strings.TrimPrefix(r.URL.EscapedPath(), previewPrefix)
	token, path, _ := strings.Cut(rest, "/")
	hash := tokenHash(token)
	now := time.Now()
	var id string
	var expires time.Time
	port := 0
	d.mu.Lock()
	if e, ok := d.sandboxes[d.previews[hash]]; ok {
		for _, p := range e.rec.Previews {
			if p.Hash == hash && p.ID == host && now.Before(p.ExpiresAt) && e.rec.State != StateDeleted {
				id, port, expires = e.rec.ID, p.Port, p.ExpiresAt
			}
		}
	}
	// What it serves (a WebSocket's relay too) ends when it expires or
	// is revoked.
	ctx, cancel := context.WithDeadline(r.Context(), expires)
	defer cancel()
	key := new(struct{})
	if port != 0 {
		if d.previewing == nil {
			d.previewing = map[string]map[*struct{}]context.CancelFunc{}
		}
		if d.previewing[hash] == nil {
			d.previewing[hash] = map[*struct{}]context.CancelFunc{}
		}
		d.previewing[hash][key] = cancel
		defer func() {
			d.mu.Lock()
			delete(d.previewing[hash], key)
			if len(d.previewing[hash]) == 0 {
				delete(d.previewing, hash)
			}
			d.mu.Unlock()
		}()
	}
	d.mu.Unlock()
	if port == 0 && !fromNode && d.previewOnOtherNode(w, r, host) {
		return
	}
	if port == 0 {
		reply.Error(w, errdefs.New(errdefs.ErrUnauthenticated, "this preview URL is unknown, expired or revoked"))
		return
	}
	if path == "" && !strings.HasSuffix(rest, "/") {
		http.Redirect(w, r, previewPrefix+token+"/", http.StatusMovedPermanently)
		return
	}
	// The sandbox's own port route, under the preview's prefix.
	out := r.Clone(ctx)
	raw := "/sandboxes/" + url.PathEscape(id) + "/ports/" + strconv.Itoa(port) + "/" + path
	u := *r.URL
	u.RawPath = raw
	var err error
	if u.Path, err = url.PathUnescape(raw); err != nil {
		reply.Error(w, fmt.Errorf("%w: %w", errdefs.ErrInvalidArgument, err))
		return
	}
	out.URL = &u
	out.SetPathValue("id", id)
	out.Header.Set(api.PrefixHeader, previewPrefix+token)
	d.forward(w, out)
}

// portPrefix is where kilnd serves a port of a sandbox: the first four
// segments of a /sandboxes/{id}/ports/{port}/… path, as escaped.
func portPrefix(u *url.URL) string {
	segs := strings.SplitN(u.EscapedPath(), "/", 6) // "", sandboxes, id, ports, port, rest
	if len(segs) < 5 {
		return ""
	}
	return strings.Join(segs[:5], "/")
}
