package rpc

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Message types (docs/protocol.md); 64-127 belong to the tracker protocol (docs/tracker.md).
const (
	MsgHello     = 1
	MsgChallenge = 2
	MsgAuth      = 3
	MsgWelcome   = 4
	MsgCall      = 5
	MsgReturn    = 6
	MsgError     = 7
	MsgEvent     = 8
	MsgClose     = 9

	ProtocolVersion = 1
)

// Limits are checked before anything is allocated for a frame (docs/protocol.md "Limits").
type Limits struct {
	MaxFrame, MaxStr, MaxBin, MaxArray, MaxMap, MaxExt, MaxDepth, MaxNDim int
	MaxBulk                                                               int64
}

// DefaultLimits are the Python implementation's defaults.
var DefaultLimits = Limits{MaxFrame: 16 << 20, MaxBulk: 4 << 30, MaxStr: 1 << 20, MaxBin: 16 << 20,
	MaxArray: 1 << 16, MaxMap: 1 << 12, MaxExt: 16 << 20, MaxDepth: 32, MaxNDim: 32}

// HandshakeLimits apply before WELCOME.
var HandshakeLimits = Limits{MaxFrame: 64 << 10, MaxBulk: 0, MaxStr: 4096, MaxBin: 4096, MaxArray: 64, MaxMap: 32,
	MaxExt: 0, MaxDepth: 4, MaxNDim: 32}

// ProtocolError: a malformed frame or value; the connection cannot be trusted afterwards.
type ProtocolError struct{ Msg string }

func (e *ProtocolError) Error() string { return "tether/rpc: protocol error: " + e.Msg }

// FrameTooLarge: a frame or bulk transfer over the limit, refused before reading it.
type FrameTooLarge struct{ Msg string }

func (e *FrameTooLarge) Error() string { return "tether/rpc: " + e.Msg }

// ErrIncomplete: the buffer holds only part of a frame; read more.
var ErrIncomplete = errors.New("tether/rpc: incomplete frame")

// Frame is one decoded message.
type Frame struct {
	Type      int
	RequestID int64
	Payload   *Map
}

// EncodeFrame returns header and body in one slice, ready for a single write.
func EncodeFrame(msgType int, requestID int64, payload *Map) ([]byte, error) {
	if payload == nil {
		payload = NewMap()
	}
	body, err := Marshal([]any{msgType, requestID, payload})
	if err != nil {
		return nil, err
	}
	out := make([]byte, 4, 4+len(body))
	binary.BigEndian.PutUint32(out, uint32(len(body)))
	return append(out, body...), nil
}

// ParseFrame decodes the frame at the start of buf, returning it and the bytes it took, ErrIncomplete when buf
// holds only part of one, or a *ProtocolError / *FrameTooLarge.
func ParseFrame(buf []byte, limits Limits) (*Frame, int, error) {
	if len(buf) < 4 {
		return nil, 0, ErrIncomplete
	}
	n := int(binary.BigEndian.Uint32(buf))
	if n > limits.MaxFrame {
		return nil, 0, &FrameTooLarge{Msg: fmt.Sprintf("frame of %d bytes exceeds the limit of %d", n, limits.MaxFrame)}
	}
	if len(buf) < 4+n {
		return nil, 0, ErrIncomplete
	}
	f, err := DecodeBody(buf[4:4+n], limits)
	return f, 4 + n, err
}

// DecodeBody decodes one frame body: [msg_type:int, request_id:int, payload:map].
func DecodeBody(body []byte, limits Limits) (*Frame, error) {
	d := &decoder{b: body, limits: limits}
	v, err := d.value(0)
	if err != nil {
		return nil, err
	}
	if d.pos != len(body) {
		return nil, &ProtocolError{Msg: fmt.Sprintf("%d trailing bytes after the frame body", len(body)-d.pos)}
	}
	arr, ok := v.([]any)
	if !ok || len(arr) != 3 {
		return nil, &ProtocolError{Msg: "a frame body must be [msg_type:int, request_id:int, payload:map]"}
	}
	mt, ok1 := arr[0].(int64)
	rid, ok2 := arr[1].(int64)
	payload, ok3 := arr[2].(*Map)
	if !ok1 || !ok2 || !ok3 {
		return nil, &ProtocolError{Msg: "a frame body must be [msg_type:int, request_id:int, payload:map]"}
	}
	if mt <= 0 || mt >= 256 || rid < 0 {
		return nil, &ProtocolError{Msg: fmt.Sprintf("bad msg_type %d or request_id %d", mt, rid)}
	}
	return &Frame{Type: int(mt), RequestID: rid, Payload: payload}, nil
}
