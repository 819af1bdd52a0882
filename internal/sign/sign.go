// Package sign owns the signing stage of a release: it loads a cosign key
// pair, signs image digests, in-toto statements (as DSSE envelopes) and
// files, stores image signatures and attestations in the registry in
// either of cosign's layouts (the sha256-<hex>.sig and .att tags, or
// Sigstore bundles as OCI referrers), and verifies all of them with the
// public key. The real cosign CLI verifies what it writes.
package sign

import (
	"bytes"
	"crypto"
	"crypto/elliptic"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/opencontainers/go-digest"
	"github.com/secure-systems-lab/go-securesystemslib/dsse"
	"github.com/sigstore/sigstore/pkg/cryptoutils"
	"github.com/sigstore/sigstore/pkg/signature"
)

// Environment variables for the key: its path or env://VAR (else
// kiln.yaml's signing.key) and its password (else COSIGN_PASSWORD, as cosign reads it).
const (
	KeyEnv      = "KILN_SIGNING_KEY"
	PasswordEnv = "KILN_SIGNING_PASSWORD"
)

// Media types and annotations of cosign's registry objects.
const (
	SimpleSigningMediaType = "application/vnd.dev.cosign.simplesigning.v1+json"
	DSSEMediaType          = "application/vnd.dsse.envelope.v1+json"
	SignatureAnnotation    = "dev.cosignproject.cosign/signature"
	InTotoPayloadType      = "application/vnd.in-toto+json"
)

// Signer holds a private key; it never leaves this process.
type Signer struct {
	sv signature.SignerVerifier
}

// Password is KILN_SIGNING_PASSWORD, else COSIGN_PASSWORD; an empty
// password is a valid one (cosign allows it).
func Password() []byte {
	if pw, ok := os.LookupEnv(PasswordEnv); ok {
		return []byte(pw)
	}
	return []byte(os.Getenv("COSIGN_PASSWORD"))
}

// EnvScheme names a key held in an environment variable instead of a
// file, as cosign's --key env://VAR does: env://COSIGN_PRIVATE_KEY.
const EnvScheme = "env://"

// IsEnv tells whether a key is named as env://VAR.
func IsEnv(key string) bool { return strings.HasPrefix(key, EnvScheme) }

// readKey reads a key file, or the variable of env://VAR.
func readKey(key, what, remedy string) ([]byte, error) {
	if IsEnv(key) {
		name := strings.TrimPrefix(key, EnvScheme)
		data := os.Getenv(name)
		if name == "" {
			return nil, fmt.Errorf("%s %s names no variable; write env://VAR", what, key)
		}
		if strings.TrimSpace(data) == "" {
			return nil, fmt.Errorf("%s %s: the variable %s is not set or empty; put the PEM text of the key in it", what, key, name)
		}
		return []byte(data), nil
	}
	data, err := os.ReadFile(key)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w; %s", what, key, errors.Unwrap(err), remedy)
	}
	return data, nil
}

// LoadKey reads an encrypted cosign private key (cosign generate-key-pair)
// from a file or env://VAR. Errors name the file or variable and what was
// expected, never the password.
func LoadKey(path string, password []byte) (*Signer, error) {
	data, err := readKey(path, "signing key", fmt.Sprintf("create one with `cosign generate-key-pair` and point %s (or kiln.yaml signing.key) at cosign.key, or at env://VAR", KeyEnv))
	if err != nil {
		return nil, err
	}
	block, _ := pem.Decode(data)
	if block == nil || (block.Type != string(cryptoutils.EncryptedSigstorePrivateKeyPEMType) && block.Type != "ENCRYPTED COSIGN PRIVATE KEY") {
		what := "no PEM block"
		if block != nil {
			what = "a PEM block of type " + block.Type
		}
		return nil, fmt.Errorf("signing key %s holds %s; want an encrypted cosign private key (ENCRYPTED SIGSTORE PRIVATE KEY, from `cosign generate-key-pair`)", path, what)
	}
	if password == nil {
		password = []byte{}
	}
	key, err := cryptoutils.UnmarshalPEMToPrivateKey(data, cryptoutils.StaticPasswordFunc(password))
	if err != nil {
		return nil, fmt.Errorf("signing key %s: cannot decrypt it with the password in %s (or COSIGN_PASSWORD): wrong password or a damaged key", path, PasswordEnv)
	}
	sv, err := signature.LoadSignerVerifier(key, crypto.SHA256)
	if err != nil {
		return nil, fmt.Errorf("signing key %s: %w", path, err)
	}
	return &Signer{sv: sv}, nil
}

// GenerateKeyPair returns a cosign-format key pair (ECDSA P-256, the
// private key encrypted with password), as cosign generate-key-pair writes.
func GenerateKeyPair(password []byte) (private, public []byte, err error) {
	if password == nil {
		password = []byte{}
	}
	return cryptoutils.GeneratePEMEncodedECDSAKeyPair(elliptic.P256(), cryptoutils.StaticPasswordFunc(password))
}

// Sign returns the base64 ECDSA signature of data, as cosign sign-blob
// writes it.
func (s *Signer) Sign(data []byte) (string, error) {
	sig, err := s.sv.SignMessage(bytes.NewReader(data))
	if err != nil {
		return "", err
	}
	return base64.StdEncoding.EncodeToString(sig), nil
}

// Verifier checks signatures with a public key.
type Verifier struct {
	v    signature.Verifier
	path string
}

// LoadPublicKey reads a PEM public key (cosign.pub) from a file or
// env://VAR.
func LoadPublicKey(path string) (*Verifier, error) {
	data, err := readKey(path, "public key", "pass the release's cosign.pub with -key or set kiln.yaml signing.publicKey")
	if err != nil {
		return nil, err
	}
	pub, err := cryptoutils.UnmarshalPEMToPublicKey(data)
	if err != nil {
		return nil, fmt.Errorf("public key %s: not a PEM public key (cosign.pub): %w", path, err)
	}
	v, err := signature.LoadVerifier(pub, crypto.SHA256)
	if err != nil {
		return nil, fmt.Errorf("public key %s: %w", path, err)
	}
	return &Verifier{v: v, path: path}, nil
}

// Matches tells whether the signer's key is the verifier's.
func (v *Verifier) Matches(s *Signer) bool {
	a, errA := v.v.PublicKey()
	b, errB := s.sv.PublicKey()
	if errA != nil || errB != nil {
		return false
	}
	return cryptoutils.EqualKeys(a, b) == nil
}

// Verifier of the signer's own key.
func (s *Signer) Verifier() *Verifier { return &Verifier{v: s.sv, path: "the signing key"} }

// Verify checks a base64 signature of data.
func (v *Verifier) Verify(data []byte, sigB64 string) error {
	sig, err := base64.StdEncoding.DecodeString(string(bytes.TrimSpace([]byte(sigB64))))
	if err != nil {
		return fmt.Errorf("the signature is not base64: %w", err)
	}
	if err := v.v.VerifySignature(bytes.NewReader(sig), bytes.NewReader(data)); err != nil {
		return fmt.Errorf("the signature does not verify with %s", v.path)
	}
	return nil
}

// Payload is cosign's simple-signing payload for an image digest: what an
// image signature signs.
func Payload(repository string, dgst digest.Digest) []byte {
	p := map[string]any{
		"critical": map[string]any{
			"identity": map[string]string{"docker-reference": repository},
			"image":    map[string]string{"docker-manifest-digest": dgst.String()},
			"type":     "cosign container image signature",
		},
		"optional": nil,
	}
	data, _ := json.Marshal(p)
	return data
}

type payload struct {
	Critical struct {
		Image struct {
			Digest string `json:"docker-manifest-digest"`
		} `json:"image"`
	} `json:"critical"`
}

// Envelope signs an in-toto statement into a DSSE envelope.
func (s *Signer) Envelope(statement []byte) ([]byte, error) {
	sig, err := s.sv.SignMessage(bytes.NewReader(dsse.PAE(InTotoPayloadType, statement)))
	if err != nil {
		return nil, err
	}
	return json.Marshal(envelope{PayloadType: InTotoPayloadType, Payload: base64.StdEncoding.EncodeToString(statement),
		Signatures: []envelopeSignature{{Sig: base64.StdEncoding.EncodeToString(sig)}}})
}

type envelope struct {
	PayloadType string              `json:"payloadType"`
	Payload     string              `json:"payload"`
	Signatures  []envelopeSignature `json:"signatures"`
}

type envelopeSignature struct {
	KeyID string `json:"keyid"`
	Sig   string `json:"sig"`
}

// OpenEnvelope verifies a DSSE envelope and returns its statement.
func (v *Verifier) OpenEnvelope(data []byte) ([]byte, error) {
	var env envelope
	if err := json.Unmarshal(data, &env); err != nil {
		return nil, fmt.Errorf("not a DSSE envelope: %w", err)
	}
	if env.PayloadType != InTotoPayloadType {
		return nil, fmt.Errorf("payload type %q, want %s", env.PayloadType, InTotoPayloadType)
	}
	statement, err := base64.StdEncoding.DecodeString(env.Payload)
	if err != nil {
		return nil, fmt.Errorf("payload is not base64: %w", err)
	}
	pae := dsse.PAE(InTotoPayloadType, statement)
	if len(env.Signatures) > 16 {
		return nil, fmt.Errorf("the envelope holds %d signatures; kiln checks at most 16", len(env.Signatures))
	}
	for _, s := range env.Signatures {
		if v.Verify(pae, s.Sig) == nil {
			return statement, nil
		}
	}
	return nil, fmt.Errorf("no signature of the envelope verifies with %s", v.path)
}
