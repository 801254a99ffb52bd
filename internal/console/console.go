// Package console serves kilnd's web console: its page and assets, built from web/console and embedded, under a strict content security policy.
package console

import (
	"bytes"
	"crypto/rand"
	"embed"
	"encoding/base64"
	"io/fs"
	"net/http"
	"path"
	"strconv"
	"strings"

	"github.com/sandkiln/sandkiln/internal/errdefs"
	"github.com/sandkiln/sandkiln/internal/reply"
)

//go:embed dist
var dist embed.FS

// noncePlaceholder is where index.html takes each answer's nonce: the
// console gives it to the style elements the terminal makes (xterm.js
// writes its styles into them), which the policy allows by nonce alone.
const noncePlaceholder = "__KILN_CSP_NONCE__"

// Handler serves the console: GET / is its page, GET /assets/FILE its
// scripts and styles.
type Handler struct {
	index  []byte
	assets fs.FS
}

// New reads the embedded build.
func New() (*Handler, error) {
	index, err := dist.ReadFile("dist/index.html")
	if err != nil {
		return nil, err
	}
	assets, err := fs.Sub(dist, "dist/assets")
	if err != nil {
		return nil, err
	}
	return &Handler{index: index, assets: assets}, nil
}

// policy is the page's: nothing from elsewhere, no inline script or
// style but the nonce's, no framing, API calls and WebSockets to kilnd
// alone.
func policy(nonce string) string {
	return strings.Join([]string{
		"default-src 'none'",
		"script-src 'self'",
		"style-src 'self' 'nonce-" + nonce + "'",
		"img-src 'self' data:",
		"font-src 'self'",
		"connect-src 'self'",
		"base-uri 'none'",
		"form-action 'none'",
		"frame-ancestors 'none'",
	}, "; ")
}

func security(h http.Header) {
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
}

// ServeIndex answers GET /: the page, with a nonce of its own.
func (h *Handler) ServeIndex(w http.ResponseWriter, r *http.Request) {
	var b [18]byte
	rand.Read(b[:])
	nonce := base64.StdEncoding.EncodeToString(b[:])
	security(w.Header())
	w.Header().Set("Content-Security-Policy", policy(nonce))
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Write(bytes.ReplaceAll(h.index, []byte(noncePlaceholder), []byte(nonce)))
}

// ServeAsset answers GET /assets/{file}: a built file, named by its
// content's hash, so it may be kept for good.
func (h *Handler) ServeAsset(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("file")
	var b []byte
	err := fs.ErrNotExist
	if name != "" && !strings.Contains(name, "/") && fs.ValidPath(name) {
		b, err = fs.ReadFile(h.assets, name)
	}
	if err != nil {
		reply.Error(w, errdefs.New(errdefs.ErrNotFound, "console: no asset "+strconv.Quote(name)))
		return
	}
	security(w.Header())
	w.Header().Set("Content-Security-Policy", "default-src 'none'")
	w.Header().Set("Cache-Control", "public, max-age=31536000, immutable")
	switch path.Ext(name) {
	case ".js":
		w.Header().Set("Content-Type", "text/javascript; charset=utf-8")
	case ".css":
		w.Header().Set("Content-Type", "text/css; charset=utf-8")
	default:
		w.Header().Set("Content-Type", http.DetectContentType(b))
	}
	w.Write(b)
}
