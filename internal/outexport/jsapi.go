// Reads of a stream's messages that must be current: from its leader,
// not from a replica's direct get.

package outexport

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// errNoMessage says the subject holds no message (or none at or after
// the sequence asked for).
var errNoMessage = errors.New("outexport: no message")

// msgGetRequest and msgGetResponse are the JetStream API's
// STREAM.MSG.GET, which its stream's leader answers. (nats.go uses the
// direct get on a stream that allows it, which any replica answers,
// perhaps one that has not yet stored the last message: the exporter
// needs the last one that is stored to resume after it and to settle a
// refused compare-and-append.)
type msgGetRequest struct {
	LastFor string `json:"last_by_subj,omitempty"`
}

type msgGetResponse struct {
	Error   *jetstream.APIError `json:"error,omitempty"`
	Message *struct {
		Sequence uint64 `json:"seq"`
		Header   []byte `json:"hdrs,omitempty"`
		Data     []byte `json:"data,omitempty"`
	} `json:"message,omitempty"`
}

// apiPrefix is the JetStream API's subject prefix for js, with its dot.
func apiPrefix(js jetstream.JetStream) string {
	o := js.Options()
	p := o.APIPrefix
	if o.Domain != "" {
		p = "$JS." + o.Domain + ".API"
	}
	if p == "" {
		p = jetstream.DefaultAPIPrefix
	}
	if !strings.HasSuffix(p, ".") {
		p += "."
	}
	return p
}

// lastOnSubject is subject's last message in stream, as its leader has
// it; errNoMessage if it holds none.
func lastOnSubject(ctx context.Context, js jetstream.JetStream, stream, subject string) (*message, error) {
	req, _ := json.Marshal(msgGetRequest{LastFor: subject})
	reply, err := js.Conn().RequestWithContext(ctx, apiPrefix(js)+"STREAM.MSG.GET."+stream, req)
	if err != nil {
		return nil, err
	}
	var resp msgGetResponse
	if err := json.Unmarshal(reply.Data, &resp); err != nil {
		return nil, fmt.Errorf("outexport: the last message of %s: %w", subject, err)
	}
	if resp.Error != nil {
		if resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound {
			return nil, errNoMessage
		}
		return nil, resp.Error
	}
	if resp.Message == nil {
		return nil, fmt.Errorf("outexport: the last message of %s: an empty answer", subject)
	}
	var h nats.Header
	if len(resp.Message.Header) > 0 {
		if h, err = nats.DecodeHeadersMsg(resp.Message.Header); err != nil {
			return nil, fmt.Errorf("outexport: %w: the last message of %s: %w", errForeign, subject, err)
		}
	}
	return decode(h, resp.Message.Data, resp.Message.Sequence)
}

// apiCode is err's JetStream error code, 0 if it has none.
func apiCode(err error) jetstream.ErrorCode {
	var ae *jetstream.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode
	}
	return 0
}
