package ctl

import (
	"fmt"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/internal/clientscheme"
)

// Connection holds the flags kubectl users expect (--kubeconfig,
// --context, -n/--namespace, --server, --token, --as, ...) and turns them
// into a client, with kubectl's loading rules: the flag, then $KUBECONFIG,
// then ~/.kube/config, then the in-cluster config.
//
// It binds client-go's clientcmd flags rather than k8s.io/cli-runtime's
// genericclioptions.ConfigFlags: the flags and rules are the same (ConfigFlags
// wraps clientcmd), but cli-runtime's package pulls in kustomize and the
// resource builder, which made the partita binary a third larger (114 MB to
// 151 MB) for flags this command does not need.
type Connection struct {
	loading   *clientcmd.ClientConfigLoadingRules
	overrides clientcmd.ConfigOverrides
}

// NewConnection returns a Connection with kubectl's default loading rules.
func NewConnection() *Connection {
	return &Connection{loading: clientcmd.NewDefaultClientConfigLoadingRules()}
}

// AddFlags adds the connection flags to fs.
func (c *Connection) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.loading.ExplicitPath, clientcmd.RecommendedConfigPathFlag, "", "Path to the kubeconfig file to use")
	clientcmd.BindOverrideFlags(&c.overrides, fs, clientcmd.RecommendedConfigOverrideFlags(""))
}

func (c *Connection) config() clientcmd.ClientConfig {
	return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(c.loading, &c.overrides)
}

// Namespace is -n, else the kubeconfig context's namespace, else "default".
func (c *Connection) Namespace() (string, error) {
	ns, _, err := c.config().Namespace()
	if err != nil {
		return "", fmt.Errorf("read the namespace from the kubeconfig: %w", err)
	}
	return ns, nil
}

// RESTConfig returns the connection's REST config.
func (c *Connection) RESTConfig() (*rest.Config, error) {
	cfg, err := c.config().ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig: %w", err)
	}
	return cfg, nil
}

// Client returns a client that knows Partita's types.
func (c *Connection) Client() (client.Client, error) {
	cfg, err := c.RESTConfig()
	if err != nil {
		return nil, err
	}
	scheme, err := Scheme()
	if err != nil {
		return nil, err
	}
	cl, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("create client for %s: %w", cfg.Host, err)
	}
	return cl, nil
}

// Scheme returns a new scheme with the built-in Kubernetes types and
// Partita's.
func Scheme() (*runtime.Scheme, error) { return clientscheme.New() }
