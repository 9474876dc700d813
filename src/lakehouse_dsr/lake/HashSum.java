// A running count and sum of 64-bit row hashes for lakehouse-dsr's collateral check (hashsum.py),
// added to inside Spark's generated code while an action reads the rows. Spark's stock Invoke calls
// `test` through java.util.function.LongPredicate, so generated code names no class of ours; tasks
// deserialize this object (the class reaches executors with SparkContext.addJar), and what comes back
// to the driver is a stock LongAccumulator. Compiled by Janino (bridge.py): raw types throughout.
package lakehouse_dsr;

import java.util.ArrayList;
import java.util.List;
import java.util.function.LongPredicate;
import org.apache.spark.sql.Column;
import org.apache.spark.sql.catalyst.expressions.Literal;
import org.apache.spark.sql.catalyst.expressions.objects.Invoke;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.ObjectType;
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

  /** A boolean column, always true, that adds `hash` of every row it is evaluated on to `hashes`:
   *  non-deterministic, so the optimizer neither moves nor drops it. */
  public Column adding(LongAccumulator hashes, Column hash) {
    List arguments = new ArrayList();
    arguments.add(hash.expr());
    return new Column(new Invoke(new Literal(new HashSum(hashes), new ObjectType(LongPredicate.class)), "test",
        DataTypes.BooleanType, seq(arguments), seq(new ArrayList()), false, false, false));
  }

  private static scala.collection.Seq seq(List items) {
    return scala.collection.JavaConverters.asScalaBuffer(items).toSeq();
  }
}
