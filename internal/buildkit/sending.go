package buildkit

import (
	"fmt"
	"sync"
	"time"

	"github.com/moby/buildkit/client"
	digest "github.com/opencontainers/go-digest"
)

// Sending shows bytes coming to this machine outside an exporter (a
// Job.Fetch) as a vertex of the progress display, the way BuildKit shows
// its exporters: a name, then a byte count, at most ten updates a second.
type Sending struct {
	send  func(*client.SolveStatus)
	vx    client.Vertex
	total int64

	mu   sync.Mutex
	done int64
	last time.Time
}

// NewSending starts the vertex; name is what the display shows.
func NewSending(send func(*client.SolveStatus), name string, total int64) *Sending {
	now := time.Now()
	s := &Sending{send: send, total: total, last: now}
	s.vx = client.Vertex{
		Digest:  digest.FromString(fmt.Sprintf("kiln sending %s %d", name, now.UnixNano())),
		Name:    name,
		Started: &now,
	}
	vx := s.vx
	send(&client.SolveStatus{Vertexes: []*client.Vertex{&vx}})
	return s
}

// Add counts n more bytes received.
func (s *Sending) Add(n int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.done += n
	if now := time.Now(); now.Sub(s.last) >= 100*time.Millisecond {
		s.last = now
		s.status(now)
	}
}

// Finish completes the vertex and its count in one update, so that the
// display prints them together, with err when the transfer failed.
func (s *Sending) Finish(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	vx := s.vx
	vx.Completed = &now
	if err != nil {
		vx.Error = err.Error()
	}
	st := s.count(now)
	st.Completed = &now
	s.send(&client.SolveStatus{Vertexes: []*client.Vertex{&vx}, Statuses: []*client.VertexStatus{st}})
}

func (s *Sending) status(now time.Time) {
	s.send(&client.SolveStatus{Statuses: []*client.VertexStatus{s.count(now)}})
}

func (s *Sending) count(now time.Time) *client.VertexStatus {
	return &client.VertexStatus{
		ID:        "sending",
		Vertex:    s.vx.Digest,
		Name:      "receiving",
		Current:   s.done,
		Total:     s.total,
		Timestamp: now,
		Started:   s.vx.Started,
	}
}
