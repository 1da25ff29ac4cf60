/*
 * A stand-in for HAMi-core in the real node's tests of hami-core slices
 * (docs/real-node.md): the chart installs it as the node's interposer
 * (agent.interposer.image=localhost/partita/interposer-test:dev), so that
 * the tests can show that the agent's /etc/ld.so.preload puts a library
 * into every process of a hami-core container without HAMi's image or a
 * GPU. It does nothing; a process that loaded it has it in its
 * /proc/self/maps and can find this symbol.
 */
const char partita_preload_test[] = "partita preload test library";
