// A running count and sum of 64-bit row hashes for lakehouse-dsr's collateral check (hashsum.py),
// added to inside Spark's generated code while an action reads the rows. Spark's stock Invoke calls
// `test` through java.util.function.LongPredicate (catalyst.py), so generated code names no class of ours; tasks
// deserialize this object (the class reaches executors with SparkContext.addJar), and what comes back
// to the driver is a stock LongAccumulator. Compiled by Janino (bridge.py): raw types throughout.
package lakehouse_dsr;

import java.util.function.LongPredicate;
import org.apache.spark.util.LongAccumulator;

public class HashSum implements LongPredicate, java.io.Serializable {
  private final LongAccumulator hashes;

  public HashSum() { this.hashes = null; }

  private HashSum(LongAccumulator hashes) { this.hashes = hashes; }

  /** Adds `hash` (its count and its sum, which wraps around at 64 bits); always true. */
  public boolean test(long hash) {
    hashes.add(hash);
    return true;
  }

  /** The object whose `test` adds a row's hash to `hashes` (catalyst.py calls it from generated code). */
  public HashSum on(LongAccumulator hashes) { return new HashSum(hashes); }
}
