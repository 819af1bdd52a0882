package config

import (
	"crypto"
	"fmt"
	"os"

	"github.com/sigstore/sigstore/pkg/cryptoutils"
)

// ReadPublicKey reads a public key in PEM ("PUBLIC KEY", PKIX), as
// `cosign generate-key-pair` writes cosign.pub.
func ReadPublicKey(path string) (crypto.PublicKey, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	key, err := cryptoutils.UnmarshalPEMToPublicKey(data)
	if err != nil {
		return nil, fmt.Errorf("%s: not a PEM public key: %w", path, err)
	}
	return key, nil
}
