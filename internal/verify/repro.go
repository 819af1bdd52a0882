package verify

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/kiln-build/kiln/internal/session"
	"github.com/kiln-build/kiln/internal/verify/inspect"
)

// ReproOutcome is the result of building one commit twice.
type ReproOutcome struct {
	First, Second []session.ImageResult
	Differences   []inspect.Difference
}

// Repro builds every image twice, the second time in isolation (every step
// re-run, an empty Go build cache), and compares the two down to files and
// ELF sections. Nothing is left under _output (the session reads the file
// system's clock there with a file it removes at once).
func Repro(ctx context.Context, opts session.Options) (*ReproOutcome, error) {
	s, err := session.Start(ctx, opts)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	tmp, err := os.MkdirTemp("", "kiln-repro-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)

	first := opts
	first.OutDir, first.SkipChecks = filepath.Join(tmp, "first"), true
	a, err := s.WriteImages(ctx, first)
	if err != nil {
		return nil, fmt.Errorf("first build: %w", err)
	}

	second, cleanup, err := s.Isolated(ctx)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	opts2 := opts
	opts2.OutDir, opts2.SkipChecks = filepath.Join(tmp, "second"), true
	b, err := second.WriteImages(ctx, opts2)
	if err != nil {
		return nil, fmt.Errorf("second, isolated build: %w", err)
	}

	out := &ReproOutcome{First: a.Images, Second: b.Images}
	for i := range a.Images {
		if a.Images[i].Digest == b.Images[i].Digest {
			continue
		}
		la, err := inspect.ReadLayout(a.Images[i].Path)
		if err != nil {
			return nil, err
		}
		lb, err := inspect.ReadLayout(b.Images[i].Path)
		if err != nil {
			return nil, err
		}
		out.Differences = append(out.Differences, inspect.DiffLayouts(a.Images[i].Name, la, lb)...)
	}
	return out, nil
}
