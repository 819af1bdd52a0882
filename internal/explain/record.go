package explain

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/kiln-build/kiln/internal/atomicfile"
	"github.com/kiln-build/kiln/internal/buildkit"
)

// The records of the last two builds, in the output folder's explain
// folder, and the marker of a last build answered as a no-op.
const (
	lastBuild  = "last.json"
	priorBuild = "previous.json"
	NoopMarker = "no-op"
)

// Save keeps a build's step inputs and outcomes in dir, moving the last
// record aside as the previous one, and explains the build against it.
func Save(dir string, inputs Inputs, steps buildkit.Steps) ([]Explanation, error) {
	prev, err := readRecord(filepath.Join(dir, lastBuild))
	if err != nil {
		return nil, err
	}
	now := Record{Inputs: inputs, Steps: steps}
	if err := os.Remove(filepath.Join(dir, NoopMarker)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	if prev != nil {
		// Another build running at the same time may have moved it already.
		if err := os.Rename(filepath.Join(dir, lastBuild), filepath.Join(dir, priorBuild)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
	}
	if err := atomicfile.Write(filepath.Join(dir, lastBuild), func(f io.Writer) error { return json.NewEncoder(f).Encode(now) }); err != nil {
		return nil, err
	}
	return Explain(now, prev), nil
}

// Last reads the records of the last two builds in dir and explains the
// last.
func Last(dir string) ([]Explanation, error) {
	now, err := readRecord(filepath.Join(dir, lastBuild))
	if err != nil {
		return nil, err
	}
	if now == nil {
		return nil, fmt.Errorf("no build recorded in %s: run `mage images` first", dir)
	}
	if _, err := os.Stat(filepath.Join(dir, NoopMarker)); err == nil {
		// The last build was a no-op answered from its record: it reused
		// every step of the one recorded.
		for i := range now.Steps {
			now.Steps[i].Cached = true
		}
		return Explain(*now, nil), nil
	}
	prev, err := readRecord(filepath.Join(dir, priorBuild))
	if err != nil {
		return nil, err
	}
	return Explain(*now, prev), nil
}

func readRecord(path string) (*Record, error) {
	return atomicfile.ReadJSON[Record](path, "build record")
}
