package mcp

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandkiln/sandkiln/api"
)

// Bounds of a preview's life, in seconds: kilnd's own.
const maxPreviewTTL = 7 * 24 * 3600

// ReadInput is file_read's arguments.
type ReadInput struct {
	Sandbox  string `json:"sandbox" jsonschema:"the sandbox's id or name"`
	Path     string `json:"path" jsonschema:"the file's absolute path in the sandbox, such as /workspace/main.py"`
	Offset   int64  `json:"offset,omitempty" jsonschema:"the byte to start at: 0 (the default), or the last result's next_offset"`
	MaxBytes int    `json:"max_bytes,omitempty" jsonschema:"most bytes in this result: default 16384, 256 to 65536"`
}

// ReadOutput is file_read's result.
type ReadOutput struct {
	Content string `json:"content"`
	// Encoding is utf-8, or base64 for content that is not text.
	Encoding   string `json:"encoding"`
	Offset     int64  `json:"offset"`
	Bytes      int    `json:"bytes"`
	Size       int64  `json:"size"`
	NextOffset int64  `json:"next_offset"`
	EOF        bool   `json:"eof"`
	MaxBytes   int    `json:"max_bytes"`
	Note       string `json:"note"`
}

// WriteInput is file_write's arguments.
type WriteInput struct {
	Sandbox  string `json:"sandbox" jsonschema:"the sandbox's id or name"`
	Path     string `json:"path" jsonschema:"the file's absolute path in the sandbox; missing parent directories are made"`
	Content  string `json:"content" jsonschema:"the whole new content of the file"`
	Encoding string `json:"encoding,omitempty" jsonschema:"utf-8 (the default) or base64, for bytes that are not text"`
	Mode     string `json:"mode,omitempty" jsonschema:"permissions in octal, such as 0755 for a script; default 0644, or the replaced file's"`
}

// FileOutput is a file as a model reads it.
type FileOutput struct {
	Path     string    `json:"path,omitempty"`
	Name     string    `json:"name"`
	Type     string    `json:"type"`
	Size     int64     `json:"size"`
	Mode     string    `json:"mode"`
	Modified time.Time `json:"modified"`
	Link     string    `json:"link,omitempty"`
}

func fileOutput(fi api.FileInfo) FileOutput {
	return FileOutput{Name: fi.Name, Type: fi.Type, Size: fi.Size, Mode: fi.Mode, Modified: fi.ModTime, Link: fi.Link}
}

// ListFilesInput is file_list's arguments.
type ListFilesInput struct {
	Sandbox string `json:"sandbox" jsonschema:"the sandbox's id or name"`
	Path    string `json:"path,omitempty" jsonschema:"the directory's absolute path: default /workspace"`
}

// ListFilesOutput is file_list's result.
type ListFilesOutput struct {
	Path    string       `json:"path"`
	Entries []FileOutput `json:"entries"`
	// Omitted counts entries past the bound, not listed.
	Omitted int    `json:"omitted"`
	Note    string `json:"note"`
}

// PreviewInput is preview_url's arguments.
type PreviewInput struct {
	Sandbox    string `json:"sandbox" jsonschema:"the sandbox's id or name"`
	Port       int    `json:"port" jsonschema:"the TCP port a server listens on inside the sandbox, such as 8000"`
	TTLSeconds int64  `json:"ttl_seconds,omitempty" jsonschema:"how long the URL works: default 3600, at most 604800"`
}

// PreviewOutput is preview_url's result.
type PreviewOutput struct {
	URL     string    `json:"url"`
	Expires time.Time `json:"expires_at"`
	Note    string    `json:"note"`
}

func (s *Server) addFileTools() {
	mcp.AddTool(s.s, &mcp.Tool{
		Name: "file_read",
		Description: "Read a file in a sandbox: at most max_bytes (default 16384) from offset. Text comes as UTF-8, anything " +
			"else as base64 (encoding says which). size is the whole file's; when eof is false, call again with next_offset " +
			"to read on.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true},
	}, s.readFile)
	mcp.AddTool(s.s, &mcp.Tool{
		Name: "file_write",
		Description: "Write a whole file in a sandbox, replacing any file there and making missing parent directories; the " +
			"file holds the whole content or, on an error, is as it was. Write source code, configuration or input data " +
			"this way rather than through shell quoting. Give mode 0755 for a script to run.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: ptr(true), IdempotentHint: true},
	}, s.writeFile)
	mcp.AddTool(s.s, &mcp.Tool{
		Name: "file_list",
		Description: "List a directory in a sandbox (default /workspace): each entry's name, type (file, dir, symlink), size, " +
			"permissions and modification time, in name order, at most 500 entries (omitted counts the rest).",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true},
	}, s.listFiles)
	mcp.AddTool(s.s, &mcp.Tool{
		Name: "preview_url",
		Description: "Make a URL that reaches an HTTP server listening on a port inside a sandbox, for a person's browser or " +
			"another program, without kilnd's token; it works for ttl_seconds (default an hour). Start the server first " +
			"(process_start), listening on 0.0.0.0 or 127.0.0.1 inside the sandbox.",
	}, s.preview)
}

func (s *Server) readFile(ctx context.Context, _ *mcp.CallToolRequest, in ReadInput) (*mcp.CallToolResult, ReadOutput, error) {
	switch {
	case in.Sandbox == "":
		return nil, ReadOutput{}, errNoSandbox
	case !strings.HasPrefix(in.Path, "/"):
		return nil, ReadOutput{}, fmt.Errorf("path %q: want an absolute path, such as /workspace/file.txt", in.Path)
	case in.Offset < 0:
		return nil, ReadOutput{}, fmt.Errorf("offset %d: want 0 or more", in.Offset)
	}
	bound, err := outputBound("max_bytes", in.MaxBytes)
	if err != nil {
		return nil, ReadOutput{}, err
	}
	sb := s.c.Handle(in.Sandbox)
	fi, err := sb.Stat(ctx, in.Path)
	if err != nil {
		return nil, ReadOutput{}, fmt.Errorf("file_read %s: %w", in.Path, err)
	}
	if fi.Type != api.FileRegular {
		return nil, ReadOutput{}, fmt.Errorf("file_read %s: it is a %s, not a file (file_list lists a directory)", in.Path, fi.Type)
	}
	r := ReadOutput{Offset: in.Offset, Size: fi.Size, MaxBytes: bound, Encoding: "utf-8"}
	var b []byte
	if in.Offset < fi.Size {
		rc, err := sb.ReadFileRange(ctx, in.Path, in.Offset, int64(bound))
		if err != nil {
			return nil, ReadOutput{}, fmt.Errorf("file_read %s: %w", in.Path, err)
		}
		b, err = io.ReadAll(io.LimitReader(rc, int64(bound)))
		rc.Close()
		if err != nil {
			return nil, ReadOutput{}, fmt.Errorf("file_read %s: %w", in.Path, err)
		}
	}
	end := in.Offset+int64(len(b)) >= fi.Size
	if !end {
		b = b[:len(b)-partialRune(b)] // the next read starts with the whole character
	}
	if utf8.Valid(b) {
		r.Content = string(b)
	} else {
		r.Content, r.Encoding = base64.StdEncoding.EncodeToString(b), "base64"
	}
	r.Bytes, r.NextOffset, r.EOF = len(b), in.Offset+int64(len(b)), end
	r.Note = fmt.Sprintf("%d bytes from offset %d of a %d-byte file; at most %d per call.", r.Bytes, r.Offset, r.Size, bound)
	if !r.EOF {
		r.Note += " Call again with offset next_offset to read on."
	}
	return nil, r, nil
}

func (s *Server) writeFile(ctx context.Context, _ *mcp.CallToolRequest, in WriteInput) (*mcp.CallToolResult, FileOutput, error) {
	switch {
	case in.Sandbox == "":
		return nil, FileOutput{}, errNoSandbox
	case !strings.HasPrefix(in.Path, "/"):
		return nil, FileOutput{}, fmt.Errorf("path %q: want an absolute path, such as /workspace/main.py", in.Path)
	}
	content := []byte(in.Content)
	switch in.Encoding {
	case "", "utf-8":
	case "base64":
		var err error
		if content, err = base64.StdEncoding.DecodeString(in.Content); err != nil {
			return nil, FileOutput{}, fmt.Errorf("content is not base64: %w", err)
		}
	default:
		return nil, FileOutput{}, fmt.Errorf("encoding %q: want utf-8 or base64", in.Encoding)
	}
	var mode fs.FileMode
	if in.Mode != "" {
		m, err := strconv.ParseUint(in.Mode, 8, 32)
		if err != nil || m > 0o7777 {
			return nil, FileOutput{}, fmt.Errorf("mode %q: want octal permissions, such as 0644 or 0755", in.Mode)
		}
		mode = fs.FileMode(m)
		if mode == 0 {
			return nil, FileOutput{}, errors.New("mode 0 would make a file nobody can read: leave it out for 0644")
		}
	}
	fi, err := s.c.Handle(in.Sandbox).WriteFile(ctx, in.Path, strings.NewReader(string(content)), mode)
	if err != nil {
		return nil, FileOutput{}, fmt.Errorf("file_write %s: %w", in.Path, err)
	}
	out := fileOutput(fi)
	out.Path = in.Path
	return nil, out, nil
}

func (s *Server) listFiles(ctx context.Context, _ *mcp.CallToolRequest, in ListFilesInput) (*mcp.CallToolResult, ListFilesOutput, error) {
	dir := in.Path
	switch {
	case in.Sandbox == "":
		return nil, ListFilesOutput{}, errNoSandbox
	case dir == "":
		dir = "/workspace"
	case !strings.HasPrefix(dir, "/"):
		return nil, ListFilesOutput{}, fmt.Errorf("path %q: want an absolute path, such as /workspace", dir)
	}
	list, err := s.c.Handle(in.Sandbox).ReadDir(ctx, dir)
	if err != nil {
		return nil, ListFilesOutput{}, fmt.Errorf("file_list %s: %w", dir, err)
	}
	out := ListFilesOutput{Path: dir, Entries: []FileOutput{}}
	for i, fi := range list {
		if i == MaxEntries {
			out.Omitted = len(list) - i
			break
		}
		out.Entries = append(out.Entries, fileOutput(fi))
	}
	out.Note = fmt.Sprintf("%d entries; at most %d per call.", len(list), MaxEntries)
	if out.Omitted > 0 {
		out.Note += fmt.Sprintf(" %d not listed: list a subdirectory, or run ls or find with exec.", out.Omitted)
	}
	return nil, out, nil
}

func (s *Server) preview(ctx context.Context, _ *mcp.CallToolRequest, in PreviewInput) (*mcp.CallToolResult, PreviewOutput, error) {
	switch {
	case in.Sandbox == "":
		return nil, PreviewOutput{}, errNoSandbox
	case in.Port < 1 || in.Port > 65535:
		return nil, PreviewOutput{}, fmt.Errorf("port %d: want 1 to 65535", in.Port)
	case in.TTLSeconds < 0 || in.TTLSeconds > maxPreviewTTL:
		return nil, PreviewOutput{}, fmt.Errorf("ttl_seconds %d: want 1 to %d (7 days), or leave it out for an hour", in.TTLSeconds, maxPreviewTTL)
	}
	p, err := s.c.Handle(in.Sandbox).Preview(ctx, in.Port, time.Duration(in.TTLSeconds)*time.Second)
	if err != nil {
		return nil, PreviewOutput{}, fmt.Errorf("preview_url port %d: %w", in.Port, err)
	}
	return nil, PreviewOutput{URL: p.URL, Expires: p.ExpiresAt,
		Note: "the URL carries its own token: anyone who has it reaches the port until it expires"}, nil
}
